"""Each key of the stack on its own: its parser, and the AWS limits and defaults it checks against.

A parser returns the typed value or raises `ValueError` with the reason, which `infra.config.parsing`
turns into a `ConfigError` naming the key; `infra.config.stack` declares which key each one parses.
What no single key decides is in `infra.config.cross_keys`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from infra.config.parsing import as_int, cidr, matching
from platform_contract import image_pin_problem, memory_mib

# The defaults a parser's example or a rule across keys compares against; `StackKeys` declares them.
DEFAULT_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
DEFAULT_RAY_VERSION = "2.58.0"
DEFAULT_KUBERNETES_VERSION = "1.36"

# IAM role names stop at 64 characters (IAM quotas), and Pulumi autonames a role by appending "-"
# and 7 random characters to its resource name. Two roles are named after the cluster: pulumi-eks's
# control-plane role "<clusterName>-eksRole-role" (its ServiceRole "<name>-eksRole" names the role
# "<name>-role") and the program's node role "<clusterName>-node". Every other name derived from the
# cluster name has more room (EKS cluster 100, log group 512, tag key 128; the bucket name is cut).
IAM_ROLE_NAME_LIMIT = 64
AUTONAME_SUFFIX_LENGTH = 8
CLUSTER_ROLE_SUFFIXES = ("-eksRole-role", "-node")
CLUSTER_NAME_MAX = IAM_ROLE_NAME_LIMIT - AUTONAME_SUFFIX_LENGTH - max(map(len, CLUSTER_ROLE_SUFFIXES))
# The retention periods CloudWatch Logs accepts (PutRetentionPolicy), in days.
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


# EKS service quota "Nodes per managed node group": 450 by default
# (https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html). Adjustable, but a count
# beyond it is a typo far more often than a raised quota.
NODES_PER_NODE_GROUP_MAX = 450


# Each shape is checked with `fullmatch` (see platform_contract); _STS_SESSION is a prefix.
RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label: 63 at most
CLUSTER_NAME_SHAPE = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]*")
_IAM_PRINCIPAL = re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:(user|role)/[\w+=,.@/-]{1,512}")
_STS_SESSION = re.compile(r"arn:aws(-[a-z]+)*:sts::(\d{12}):assumed-role/([\w+=,.@-]+)/")
RESERVATION_ID = re.compile(r"cr-[0-9a-f]{8,17}")
K8S_VERSION = re.compile(r"1\.\d{2}")


# VPC ranges AWS warns against: 172.17.0.0/16 is Docker's default bridge network, whose routes shadow
# VPC addresses on any host that runs Docker; 169.254.0.0/16 is link-local (instance metadata, the
# Amazon DNS server).
# The prefix lengths `vpcCidr` may have, widest first.
VPC_PREFIX_LENGTHS = (16, 20)
VPC_CIDRS_TO_AVOID = {
    ipaddress.ip_network("172.17.0.0/16"): "the Docker bridge network",
    ipaddress.ip_network("169.254.0.0/16"): "link-local (instance metadata, DNS)",
}


def parse_vpc_cidr(value: Any) -> str:
    network = ipaddress.ip_network(cidr(value))
    shortest, longest = VPC_PREFIX_LENGTHS
    if not isinstance(network, ipaddress.IPv4Network) or not shortest <= network.prefixlen <= longest:
        raise ValueError(f"expected an IPv4 block between /{shortest} and /{longest}, e.g. 10.0.0.0/16")
    for avoided, why in VPC_CIDRS_TO_AVOID.items():
        if network.overlaps(avoided):
            raise ValueError(f"overlaps {avoided}, {why}: use another private block, e.g. 10.0.0.0/16")
    return str(network)


# EKS service quota "Public endpoint access CIDR ranges per cluster": 40, not adjustable
# (https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html).
PUBLIC_ACCESS_CIDRS_MAX = 40
# Addresses the public endpoint never sees a caller come from: RFC 1918, carrier-grade NAT (RFC
# 6598), loopback, link-local, "this network". The documentation ranges (RFC 5737) stay allowed.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(block)
    for block in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "0.0.0.0/8",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
    )
)


def parse_cidr_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value:
        raise ValueError('expected a non-empty list of CIDR blocks, e.g. ["203.0.113.7/32"]')
    blocks = tuple(cidr(item) for item in value)
    if len(blocks) > PUBLIC_ACCESS_CIDRS_MAX:
        raise ValueError(
            f"{len(blocks)} blocks: EKS takes at most {PUBLIC_ACCESS_CIDRS_MAX} per cluster (a quota that "
            "cannot be raised); merge neighbouring addresses into wider blocks"
        )
    networks = [ipaddress.ip_network(block) for block in blocks]
    v4 = [network for network in networks if isinstance(network, ipaddress.IPv4Network)]
    v6 = [network for network in networks if isinstance(network, ipaddress.IPv6Network)]
    prefixes = [block.prefixlen for block in ipaddress.collapse_addresses(v4)]
    prefixes += [block.prefixlen for block in ipaddress.collapse_addresses(v6)]
    if 0 in prefixes:
        raise ValueError(
            "the blocks cover every address (0.0.0.0/0, or halves of it): that opens the Kubernetes API "
            "to the whole internet; list your own addresses"
        )
    for network in networks:
        within = [block for block in _NOT_PUBLIC if block.version == network.version]
        private = next((block for block in within if network.subnet_of(block)), None)  # type: ignore[arg-type]
        if private is not None:
            raise ValueError(
                f"{network} is within {private}, which the public endpoint never sees a caller come from: "
                "list your public address (curl -s https://checkip.amazonaws.com)"
            )
    return blocks


def parse_cluster_name(value: Any) -> str:
    name = matching(CLUSTER_NAME_SHAPE, "eks-ray-train")(value)
    if len(name) > CLUSTER_NAME_MAX:
        raise ValueError(
            f"at most {CLUSTER_NAME_MAX} characters ({len(name)} given): pulumi-eks names the cluster's IAM role "
            f"'<clusterName>-eksRole-role' plus 8 random characters, and IAM role names stop at {IAM_ROLE_NAME_LIMIT}"
        )
    return name


def parse_principal_arns(value: Any) -> tuple[str, ...]:
    """IAM users and roles for EKS access entries (a role ARN may carry a path; STS sessions may not)."""
    if not isinstance(value, list) or not value:
        raise ValueError('expected a non-empty list of IAM ARNs, e.g. ["arn:aws:iam::123456789012:role/ci"]')
    for arn in value:
        session = _STS_SESSION.match(str(arn))
        if session:
            raise ValueError(
                f"{arn} is an STS session, which EKS access entries refuse: "
                f"give the role's own ARN, arn:aws:iam::{session.group(2)}:role/{session.group(3)}"
            )
        if not isinstance(arn, str) or not _IAM_PRINCIPAL.fullmatch(arn):
            raise ValueError(
                f"{arn!r} is not the ARN of an IAM user or role, e.g. arn:aws:iam::123456789012:role/ci"
            )
    repeated = sorted({arn for arn in value if value.count(arn) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed twice (EKS allows one access entry per principal)")
    return tuple(value)


def parse_log_retention(value: Any) -> int:
    days = as_int(1)(value)
    if days not in LOG_RETENTION_DAYS:
        raise ValueError(
            f"CloudWatch Logs keeps logs for one of {', '.join(map(str, LOG_RETENTION_DAYS))} days"
        )
    return days


def parse_image(value: Any) -> str:
    if not isinstance(value, str) or not value or any(character.isspace() for character in value):
        raise ValueError("expected a container image reference (no spaces, tabs or newlines)")
    repository = parse_image_reference(value).repository
    if repository != repository.lower():
        raise ValueError(
            f"the repository {repository!r} must be lowercase (OCI distribution spec); the registry host may not be"
        )
    problem = image_pin_problem(value)
    if problem:
        raise ValueError(
            f"pin the image to a tag or digest (not latest), e.g. repo/ray:train-ml-cuda-v1.1; this one {problem}"
        )
    return value


@dataclass(frozen=True)
class ImageReference:
    """An image reference as the distribution API takes it apart: the registry host, the repository
    (`<name>`), and the tag and digest it names."""

    host: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def api_host(self) -> str:
        """The host that serves the API: Docker Hub's references say `docker.io` (or nothing), its API
        answers at registry-1.docker.io."""
        return "registry-1.docker.io" if self.host == "docker.io" else self.host


def parse_image_reference(reference: str) -> ImageReference:
    """`[host[:port]/]path[:tag][@digest]`, as Docker reads a reference: the first path component is
    the host when it has a `.` or a `:` or is `localhost`; otherwise the image is Docker Hub's, whose
    one-component names live under `library/`."""
    name, _, digest = reference.partition("@")
    head, _, last = name.rpartition("/")
    last, _, tag = last.partition(":")
    path = f"{head}/{last}" if head else last
    first, _, rest = path.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ImageReference(first, rest, tag or None, digest or None)
    return ImageReference(
        "docker.io", path if "/" in path else f"library/{path}", tag or None, digest or None
    )


parse_node_count = as_int(
    1,
    NODES_PER_NODE_GROUP_MAX,
    "EKS's default quota of nodes per managed node group; the quota can be raised",
)


def parse_memory_quantity(value: Any) -> str:
    """Kept as written (it goes into the pod spec), once it is known to parse."""
    memory_mib(str(value))
    return str(value)
