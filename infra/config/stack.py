"""Stack configuration: parsed and validated in one place into typed, immutable settings.

Every key of the `eks-ray-train` namespace is known here. A bad value or an unknown key raises
`ConfigError`, whose message names the key, the value and the fix, so `pulumi preview` stops
before any resource exists. Parsing is a pure function of a dict (`parse_settings`), so tests
exercise it without a Pulumi engine; `load_settings` only gathers that dict from the stack.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import botocore.exceptions
import botocore.session
import pulumi
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config.aws_identity import AwsCredentialSettings, AwsSettingsError
from infra.config.parsing import (
    ConfigError,
    as_bool,
    as_int,
    cidr,
    did_you_mean,
    key_names,
    matching,
    one_of,
    validated,
)
from infra.config.training_settings import TrainingSettings, parse_training
from platform_contract import (
    AVAILABILITY_ZONE,
    INSTANCE_TYPE,
    PROJECT,
    REGION,
    image_digest_problem,
    image_pin_problem,
    is_dev_stack,
    memory_mib,
)

__all__ = ["ConfigError", "StackSettings", "load_settings", "parse_settings"]

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


# What becomes of the GPU nodes after the run (`gpuNodesAfterTraining`); the first is the default.
KEEP, RELEASE = "keep", "release"
GPU_NODES_AFTER_TRAINING = (KEEP, RELEASE)


# EKS service quota "Nodes per managed node group": 450 by default
# (https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html). Adjustable, but a count
# beyond it is a typo far more often than a raised quota.
NODES_PER_NODE_GROUP_MAX = 450


@dataclass(frozen=True)
class AwsIdentity:
    """Who Pulumi acts as (`aws:profile`, `aws:assumeRoles`): everything that talks to the cluster uses it too."""

    profile: str | None = None
    role_arn: str | None = None


# --- the parsers of single keys: each returns the typed value or raises ValueError with the reason --

# Each shape is checked with `fullmatch` (see platform_contract); _STS_SESSION is a prefix.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label: 63 at most
_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]*")
_IAM_PRINCIPAL = re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:(user|role)/[\w+=,.@/-]{1,512}")
_STS_SESSION = re.compile(r"arn:aws(-[a-z]+)*:sts::(\d{12}):assumed-role/([\w+=,.@-]+)/")
_RESERVATION = re.compile(r"cr-[0-9a-f]{8,17}")
_K8S_VERSION = re.compile(r"1\.\d{2}")


# VPC ranges AWS warns against: 172.17.0.0/16 is Docker's default bridge network, whose routes shadow
# VPC addresses on any host that runs Docker; 169.254.0.0/16 is link-local (instance metadata, the
# Amazon DNS server).
# The prefix lengths `vpcCidr` may have, widest first.
VPC_PREFIX_LENGTHS = (16, 20)
_VPC_CIDRS_TO_AVOID = {
    ipaddress.ip_network("172.17.0.0/16"): "the Docker bridge network",
    ipaddress.ip_network("169.254.0.0/16"): "link-local (instance metadata, DNS)",
}


def _vpc_cidr(value: Any) -> str:
    network = ipaddress.ip_network(cidr(value))
    shortest, longest = VPC_PREFIX_LENGTHS
    if not isinstance(network, ipaddress.IPv4Network) or not shortest <= network.prefixlen <= longest:
        raise ValueError(f"expected an IPv4 block between /{shortest} and /{longest}, e.g. 10.0.0.0/16")
    for avoided, why in _VPC_CIDRS_TO_AVOID.items():
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


def _cidr_list(value: Any) -> tuple[str, ...]:
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


def _cluster_name(value: Any) -> str:
    name = matching(_CLUSTER_NAME, "eks-ray-train")(value)
    if len(name) > CLUSTER_NAME_MAX:
        raise ValueError(
            f"at most {CLUSTER_NAME_MAX} characters ({len(name)} given): pulumi-eks names the cluster's IAM role "
            f"'<clusterName>-eksRole-role' plus 8 random characters, and IAM role names stop at {IAM_ROLE_NAME_LIMIT}"
        )
    return name


def _principal_arns(value: Any) -> tuple[str, ...]:
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


def _log_retention(value: Any) -> int:
    days = as_int(1)(value)
    if days not in LOG_RETENTION_DAYS:
        raise ValueError(
            f"CloudWatch Logs keeps logs for one of {', '.join(map(str, LOG_RETENTION_DAYS))} days"
        )
    return days


def _image(value: Any) -> str:
    if not isinstance(value, str) or not value or any(character.isspace() for character in value):
        raise ValueError("expected a container image reference (no spaces, tabs or newlines)")
    repository = _image_repository(value)
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


def _image_repository(reference: str) -> str:
    """The repository path of an image reference: no registry host, tag or digest."""
    name = reference.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    is_host = rest and ("." in first or ":" in first or first == "localhost")
    return rest if is_host else name


_node_count = as_int(
    1,
    NODES_PER_NODE_GROUP_MAX,
    "EKS's default quota of nodes per managed node group; the quota can be raised",
)


# Ray's own images carry the Ray version in the tag (rayproject/ray:2.58.0-py311-gpu); KubeRay
# starts the pods for `rayVersion`, and a Ray that differs from it fails at the head's start.
_RAY_IMAGE_TAG = re.compile(r"(?:.*/)?ray(?:-ml)?:(\d+\.\d+\.\d+)(?:[-.].*)?")
# The RayCluster turns on Ray's token authentication (`authOptions`), which Ray has since 2.52.0 and
# KubeRay refuses below it (kuberay v1.7.0 ray-operator/controllers/ray/utils/validation.go).
_RAY_TOKEN_AUTH_SINCE = "2.52.0"


def version_key(version: str) -> tuple[int, ...]:
    """A dotted version (`1.35`, `2.52.0`) as numbers, to compare and sort by."""
    return tuple(int(part) for part in version.split("."))


def _ray_version_problem(image: str, ray_version: str) -> str | None:
    """Why `rayVersion` cannot be the image's Ray, where the image says which Ray it has, or cannot
    run the RayCluster's token authentication."""
    if image.split("@", 1)[0] == DEFAULT_IMAGE and ray_version != DEFAULT_RAY_VERSION:
        return (
            f"the default image carries Ray {DEFAULT_RAY_VERSION}: remove rayVersion, or set image to an "
            f"image with Ray {ray_version}"
        )
    tagged = _RAY_IMAGE_TAG.fullmatch(image.split("@", 1)[0])
    if tagged and tagged.group(1) != ray_version:
        return f"the image {image} carries Ray {tagged.group(1)}: set rayVersion to {tagged.group(1)}"
    if version_key(ray_version) < version_key(_RAY_TOKEN_AUTH_SINCE):
        return (
            f"the RayCluster turns on Ray's token authentication, which Ray has since {_RAY_TOKEN_AUTH_SINCE} "
            f"(KubeRay refuses it below): use an image with Ray {_RAY_TOKEN_AUTH_SINCE} or later"
        )
    return None


def _memory_quantity(value: Any) -> str:
    """Kept as written (it goes into the pod spec), once it is known to parse."""
    memory_mib(str(value))
    return str(value)


_STRICT_KEYS = ConfigDict(
    frozen=True, strict=True, alias_generator=to_camel, validate_by_name=True, validate_by_alias=True
)


class StackKeys(BaseModel):
    """Every key of the project's namespace, declared once: its camelCase name (the alias), type,
    default, the parser whose `ValueError` names the reason, and the description the docs' key
    table is generated from (`python -m tools docs`)."""

    model_config = _STRICT_KEYS

    cluster_name: Annotated[str, BeforeValidator(_cluster_name)] = Field(
        default="eks-ray-train",
        description=f"EKS cluster name; at most {CLUSTER_NAME_MAX} characters (IAM role names stop at {IAM_ROLE_NAME_LIMIT}, and pulumi-eks names the cluster's role `<clusterName>{CLUSTER_ROLE_SUFFIXES[0]}` plus a random suffix of {AUTONAME_SUFFIX_LENGTH} characters)",
    )
    kubernetes_version: Annotated[
        str, BeforeValidator(matching(_K8S_VERSION, f'"{DEFAULT_KUBERNETES_VERSION}" (quote it in YAML)'))
    ] = Field(
        default=DEFAULT_KUBERNETES_VERSION,
        description=f'EKS version; quote it in YAML (`"{DEFAULT_KUBERNETES_VERSION}"`), or it becomes the number {DEFAULT_KUBERNETES_VERSION}. The preview asks EKS which versions it offers in the region (`eks:DescribeClusterVersions`), refuses any other, and warns about one in extended support (billed at a higher rate)',
    )
    vpc_cidr: Annotated[str, BeforeValidator(_vpc_cidr)] = Field(
        default="10.0.0.0/16",
        description=f"VPC range, /{VPC_PREFIX_LENGTHS[0]} to /{VPC_PREFIX_LENGTHS[1]}; not overlapping "
        + ", or ".join(f"{block}, {why}" for block, why in _VPC_CIDRS_TO_AVOID.items()),
    )
    system_node_type: Annotated[str, BeforeValidator(matching(INSTANCE_TYPE, "m7i.xlarge"))] = Field(
        default="m7i.xlarge",
        description="instance type of the system node group (KubeRay operator, CoreDNS, Ray head); x86_64, as its AMI (`AL2023_x86_64_STANDARD`)",
    )
    system_node_count: Annotated[int, BeforeValidator(_node_count)] = Field(
        default=1,
        description=f"system nodes; at most {NODES_PER_NODE_GROUP_MAX} (EKS's default quota of nodes per managed node group)",
    )
    gpu_node_type: Annotated[str, BeforeValidator(matching(INSTANCE_TYPE, "g6.12xlarge"))] = Field(
        default="g6.12xlarge",
        description="GPU instance type; must support EFA and be x86_64, as its AMI (`AL2023_x86_64_NVIDIA`)",
    )
    gpu_node_count: Annotated[int, BeforeValidator(_node_count)] = Field(
        default=2,
        description=f"GPU nodes, one Ray worker pod each; at most {NODES_PER_NODE_GROUP_MAX} (EKS's default quota of nodes per managed node group). One node reaches no network transport, so with `1` the run must expect `intra-node`",
    )
    gpu_az: Annotated[str | None, BeforeValidator(matching(AVAILABILITY_ZONE, "us-east-2a"))] = Field(
        default=None,
        description="the one zone of the GPU nodes; when unset: the capacity reservation's zone, else the first zone (by name) offering both node types",
    )
    capacity_reservation_id: Annotated[
        str | None, BeforeValidator(matching(_RESERVATION, "cr-0123456789abcdef0"))
    ] = Field(
        default=None,
        description="launch the GPU nodes into this On-Demand Capacity Reservation or Capacity Block for ML (told apart by its `ReservationType`); it decides the GPU zone. The stack then creates no placement group: create the reservation in a cluster placement group and the nodes launch into that group. The GPU node group then updates with the MINIMAL strategy (each node is terminated before its replacement launches); see [operations](operations/capacity-reservations.md)",
    )
    image: Annotated[str, BeforeValidator(_image)] = Field(
        default=DEFAULT_IMAGE,
        description=f"image of the Ray head and workers (AWS's Ray Train container: Ray {DEFAULT_RAY_VERSION}, PyTorch 2.13.0, NCCL with aws-ofi-nccl), pinned by digest (`<repository>@sha256:<digest>`) on every stack but a dev one (`dev`, `dev-*`, `*-dev`), which may run a tag other than latest. A tag can move, so a node replaced later could run other bits than the head: on a dev stack the preview warns, on any other it refuses a tag, the default's included. `crane digest <image>`, `docker buildx imagetools inspect <image>` or, in your own ECR, `aws ecr describe-images` prints the digest",
    )
    ray_version: Annotated[
        str, BeforeValidator(matching(re.compile(r"\d+\.\d+\.\d+"), DEFAULT_RAY_VERSION))
    ] = Field(
        default=DEFAULT_RAY_VERSION,
        description=f"Ray version of the image (KubeRay needs it); refused when the image says another (the default image carries Ray {DEFAULT_RAY_VERSION}, and Ray's own images name theirs in the tag: `rayproject/ray:{DEFAULT_RAY_VERSION}-py311-gpu`), and below {_RAY_TOKEN_AUTH_SINCE}, which lacks the token authentication the RayCluster turns on",
    )
    namespace: Annotated[str, BeforeValidator(matching(_NAME, "ray-train"))] = Field(
        default="ray-train", description="Kubernetes namespace of the RayCluster"
    )
    worker_cpu: Annotated[int, BeforeValidator(as_int(1))] = Field(
        default=40, description="CPU of a worker pod (requests = limits); must fit the node"
    )
    worker_memory: Annotated[str, BeforeValidator(_memory_quantity)] = Field(
        default="160Gi", description="memory of a worker pod (requests = limits); must fit the node"
    )
    endpoint_public_access: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=True,
        description="public Kubernetes API endpoint, limited to `endpointPublicAccessCidrs` (the private one is always on). Every `pulumi up` installs the Helm releases, the RayCluster and the training run through the API from the machine it runs on, which a private endpoint admits only from inside the stack's VPC or a network connected to it. So `false` is taken only for a cluster that already runs and whose private endpoint this machine reaches: its name resolves to an address in the VPC that accepts a connection on 443 (the cluster security group must admit it); the preview refuses it otherwise, and on a stack not yet deployed ([operations](operations/changing-a-live-stack.md#a-private-api-endpoint))",
    )
    endpoint_public_access_cidrs: Annotated[tuple[str, ...], BeforeValidator(_cidr_list)] = Field(
        default=(),
        description=f"who may reach the public API endpoint; required while it is public, refused while it is not; refused: blocks that together cover every address (`0.0.0.0/0`, its halves), private and other non-public ranges (RFC 1918, 100.64.0.0/10, loopback, link-local), more than {PUBLIC_ACCESS_CIDRS_MAX} blocks (EKS's limit per cluster)",
    )
    admin_principal_arns: Annotated[tuple[str, ...], BeforeValidator(_principal_arns)] = Field(
        default=(),
        description="IAM user or role ARNs that get cluster-admin access (an EKS access entry with `AmazonEKSClusterAdminPolicy`, cluster scope), e.g. `pulumi config set --path 'adminPrincipalArns[0]' arn:aws:iam::<account>:role/<name>`. Leave out the identity that creates the cluster: it already has an entry, and listing it fails with `ResourceInUseException` (the preview warns). STS session ARNs are refused: give the role's own ARN",
    )
    log_retention_days: Annotated[int, BeforeValidator(_log_retention)] = Field(
        default=30,
        description=f"days CloudWatch keeps the control-plane logs; one of CloudWatch's values: {', '.join(map(str, LOG_RETENTION_DAYS))}. The program creates the log group `/aws/eks/<clusterName>/cluster` itself, before the cluster",
    )
    # `pulumi destroy` empties the checkpoint bucket (every object version) only when asked to.
    checkpoints_force_destroy: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=False,
        description="let `pulumi destroy` delete the checkpoint bucket with everything in it, every object version included; off, the destroy stops at a bucket that still holds checkpoints. Destroy reads the value recorded by the last `pulumi up`: set it, run `pulumi up`, then `pulumi destroy` ([operations](operations/tearing-down.md))",
    )
    vpc_flow_logs: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=False,
        description="record the VPC's flow logs (all traffic, accepted and rejected) in the CloudWatch log group `/aws/vpc-flow-logs/<clusterName>`, kept `logRetentionDays`, delivered through an IAM role of their own",
    )
    observability: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=True,
        description="see the run in CloudWatch: the `amazon-cloudwatch-observability` EKS add-on on every node (GPU and EFA metrics per node, Container Insights with enhanced observability), the job's own metrics (namespace `EksRayTrain`) and the dashboard `<clusterName>-<region>` (`pulumi stack output dashboard`). About US$ 0.03 for a one-hour run of the default stack and US$ 18 a month while it stands ([operations](operations/cloudwatch.md)); `false` creates none of it and the job publishes nothing",
    )
    gpu_nodes_after_training: Annotated[str, BeforeValidator(one_of(*GPU_NODES_AFTER_TRAINING))] = Field(
        default=KEEP,
        description="what becomes of the GPU nodes once the training run has its verdict: `keep` leaves them running (the preview says what they cost per hour idle); `release` scales the GPU node group to 0 after the job ends, and the next run that needs them scales it back to `gpuNodeCount` and waits for the nodes. The program then creates the group with a minimum of 0 and leaves its desired size to the training run ([operations](operations/gpu-nodes-after-training.md))",
    )
    gpu_node_auto_repair: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=True,
        description="EKS node auto repair on the GPU node group, with the `eks-node-monitoring-agent` EKS add-on that reports each node's GPU, kernel, network and storage health: EKS reboots or replaces a GPU node that stays unhealthy (a GPU fault for 10 minutes). A repair drains the node, which the running job meets as any drain: a checkpoint within the worker pods' grace, then a restart from it once the node is back ([operations](operations/node-repair.md)); `false` installs no agent and leaves repairs to you",
    )
    train: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=True, description="run the training job during `pulumi up`"
    )
    benchmark: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=False,
        description="also run the EFA-vs-TCP comparison after the training job (needs `train: true`)",
    )
    # Only its presence is kept here; the value stays a Pulumi secret (see `hf_token`).
    has_hf_token: Annotated[bool, BeforeValidator(bool)] = Field(
        default=False,
        alias="hfToken",
        description="Hugging Face token for gated models; set it with `pulumi config set --secret hfToken ...` (a plain-text value is refused): it becomes a Kubernetes Secret the Ray pods read as a file (`HF_TOKEN_PATH`, not an environment variable), never plain text in the state",
        json_schema_extra={"shown_default": "none"},
    )
    training: Annotated[TrainingSettings, BeforeValidator(parse_training)] = Field(
        default=TrainingSettings(),
        description="arguments of the training job, below",
        json_schema_extra={"shown_default": "`{preset: smoke}`"},
    )


class StackSettings(StackKeys):
    """Every setting of one stack, validated; derived sizes live in `infra.aws_facts.sizing`."""

    region: str
    aws_identity: AwsIdentity = AwsIdentity()

    @property
    def worker_memory_mib(self) -> int:
        return memory_mib(self.worker_memory)


# `aws:region` is the AWS provider's key, read with the project's keys; the docs list it first.
REGION_KEY_DESCRIPTION = "region of the stack (the `aws` provider's own key); a region of the `aws` partition: `aws-cn`, `aws-us-gov` and other partitions are refused (the IAM policy ARNs and the default image are the `aws` partition's)"


# Settings of the AWS provider (pulumi-aws's config schema) that people set in the project's namespace.
_AWS_PROVIDER_KEYS = ("region", "profile", "accessKey", "secretKey", "token", "assumeRole", "assumeRoles")


@functools.cache  # a botocore session loads its endpoint data: about 0.1 s a call otherwise
def _partition(region: str) -> str | None:
    """The AWS partition of a region, from botocore's endpoint data; None for a region it does not know."""
    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except botocore.exceptions.UnknownRegionError:
        return None


def _check_keys(raw: Mapping[str, Any]) -> None:
    """Unknown keys stop the preview with the closest known one (or the AWS provider's key)."""
    known = key_names(StackKeys)
    for key in raw:
        if key in known:
            continue
        if key in _AWS_PROVIDER_KEYS:
            raise ConfigError(
                f"config key '{PROJECT}:{key}' is a setting of the AWS provider: set 'aws:{key}' instead "
                f"(`pulumi config rm {key}`, then `pulumi config set aws:{key} ...`)"
            )
        raise ConfigError(f"unknown config key '{key}': {did_you_mean(key, known)}")


def _aws_identity(aws: Mapping[str, Any]) -> AwsIdentity:
    """The profile and role the AWS provider uses (`aws:` keys without the namespace), as the
    cluster's kubeconfig can use them; the one parser of those keys is `infra.config.aws_identity`."""
    try:
        profile, role_arn = AwsCredentialSettings.from_config(
            {f"aws:{key}": value for key, value in aws.items()}
        ).kubeconfig_identity()
    except AwsSettingsError as err:
        raise ConfigError(f"config key '{err.key}': {err.reason}") from None
    return AwsIdentity(profile=profile, role_arn=role_arn)


def _region(region: str | None) -> str:
    if not region:
        raise ConfigError("config key 'aws:region' is not set: run `pulumi config set aws:region us-east-2`")
    if not REGION.fullmatch(region):
        raise ConfigError(f"config key 'aws:region' = {region!r}: expected a region name such as us-east-2")
    partition = _partition(region)
    if partition not in (None, "aws"):
        raise ConfigError(
            f"config key 'aws:region' = {region!r} is in the {partition} partition: the program's IAM policy "
            "ARNs (arn:aws:iam::aws:policy/...), EKS access policy and default image (public.ecr.aws) are "
            "those of the aws partition; pick a region of the aws partition"
        )
    return region


def parse_settings(
    raw: Mapping[str, Any], region: str | None, aws: Mapping[str, Any] | None = None, *, stack: str
) -> StackSettings:
    """Validate the stack's `eks-ray-train:*` values (keys without the namespace) for `region`.

    `aws` holds the `aws:*` values that decide the identity (keys without the namespace); `stack`
    is the stack's name, which says whether it is a dev stack (`platform_contract.is_dev_stack`).
    """
    region = _region(region)
    _check_keys(raw)
    settings = validated(StackSettings, raw, region=region, aws_identity=_aws_identity(aws or {}))
    return _across_keys(settings, stack)


def _across_keys(settings: StackSettings, stack: str) -> StackSettings:
    """What no single key decides: values that contradict each other, or the stack's kind."""
    region = settings.region
    refusal = image_tag_refusal(settings.image, stack)
    if refusal:
        raise ConfigError(refusal)
    if settings.gpu_az and not settings.gpu_az.startswith(region):
        raise ConfigError(
            f"config key 'gpuAz' = {settings.gpu_az!r} is not in region {region}: "
            f"pick one of the region's zones (e.g. {region}a) or remove the key to choose automatically"
        )
    if settings.benchmark and not settings.train:
        raise ConfigError(
            "config key 'benchmark' = true needs train: true (the comparison runs the training job over "
            "EFA, then over TCP): set train: true, or remove benchmark"
        )
    if settings.endpoint_public_access and not settings.endpoint_public_access_cidrs:
        raise ConfigError(
            "config key 'endpointPublicAccessCidrs' is required while the API endpoint is public: "
            "run `pulumi config set --path 'endpointPublicAccessCidrs[0]' $(curl -s https://checkip.amazonaws.com)/32`"
        )
    if not settings.endpoint_public_access and settings.endpoint_public_access_cidrs:
        raise ConfigError(
            "config key 'endpointPublicAccessCidrs' limits the public API endpoint, which endpointPublicAccess = "
            "false turns off: remove it (`pulumi config rm endpointPublicAccessCidrs`)"
        )
    ray_problem = _ray_version_problem(settings.image, settings.ray_version)
    if ray_problem:
        raise ConfigError(f"config key 'rayVersion' = {settings.ray_version!r}: {ray_problem}")
    if settings.gpu_node_count == 1 and settings.train and settings.training.expect_transport != "intra-node":
        raise ConfigError(
            f"config keys 'gpuNodeCount' = 1 and 'training.expectTransport' = "
            f"{settings.training.expect_transport!r}: the workers of one node reach each other over "
            "NVLink or PCIe, never the network, so the run could only fail its transport check: "
            "set gpuNodeCount to 2 or more, or training.expectTransport: intra-node"
        )
    return settings


def stack_config_values(project: str = PROJECT) -> dict[str, Any]:
    """Every value the engine passed for the project's namespace, keyed without the namespace."""
    merged = {**pulumi.runtime.config.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{project}:"
    return {key[len(prefix) :]: value for key, value in merged.items() if key.startswith(prefix)}


def hf_token() -> pulumi.Output[str] | None:
    """The Hugging Face token for gated models, as a secret Output (never a plain string)."""
    return pulumi.Config(PROJECT).get_secret("hfToken")


def _how_to_pin(image: str) -> str:
    """How to find an image's digest and pin it, for the warning and the refusal."""
    name = image.split("@", 1)[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    return (
        f"`docker buildx imagetools inspect {image}` (or `crane digest {image}`; in your own ECR, `aws ecr "
        "describe-images --repository-name <name> --image-ids imageTag=<tag>`) prints it; then "
        f"`pulumi config set image {repository}@sha256:<digest>`"
    )


def moving_tag_warning(image: str) -> str | None:
    """A tag can be moved to other bits (AWS's `train-ml-cuda-v1.1` follows patch releases); a node
    replaced later could pull another Ray than the head runs, which Ray does not survive. A dev stack
    may run one, with this warning."""
    if "@" in image:
        return None
    return (
        f"config key 'image' = {image!r} is a tag, which its publisher can move: a node replaced later may run "
        f"other bits than the head. Pin the digest: {_how_to_pin(image)}"
    )


def image_tag_refusal(image: str, stack: str) -> str | None:
    """Every stack but a dev one runs its image by digest, the default's tag included."""
    problem = image_digest_problem(image)
    if problem is None or is_dev_stack(stack):
        return None
    default = " (the default)" if image == DEFAULT_IMAGE else ""
    return (
        f"config key 'image' = {image!r}{default} {problem}; stack {stack!r} is not a dev stack (dev, dev-*, "
        f"*-dev), so it runs its image by digest: {_how_to_pin(image)}"
    )


def load_settings() -> StackSettings:
    """Read and validate the current stack's configuration."""
    settings = parse_settings(
        stack_config_values(),
        pulumi.Config("aws").get("region"),
        stack_config_values("aws"),
        stack=pulumi.get_stack(),
    )
    if settings.has_hf_token and not pulumi.runtime.is_config_secret(f"{PROJECT}:hfToken"):
        raise ConfigError(
            "config key 'hfToken' is stored in plain text in the stack file: run "
            "`pulumi config set --secret hfToken <token>` (and revoke the token if the file was shared)"
        )
    warning = moving_tag_warning(settings.image)
    if warning:
        pulumi.log.warn(warning)
    return settings
