"""Stack configuration: parsed and validated in one place into typed, immutable settings.

Every key of the `eks-ray-train` namespace is known here. A bad value or an unknown key raises
`ConfigError`, whose message names the key, the value and the fix, so `pulumi preview` stops
before any resource exists. Parsing is a pure function of a dict (`parse_settings`), so tests
exercise it without a Pulumi engine; `load_settings` only gathers that dict from the stack.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import botocore.exceptions
import botocore.session
import pulumi

from infra.aws_identity import AwsCredentialSettings, AwsSettingsError
from platform_facts import (
    AVAILABILITY_ZONE,
    EXPECTABLE_TRANSPORTS,
    INSTANCE_TYPE,
    PROJECT,
    REGION,
    image_pin_problem,
    memory_mib,
)
from training.config import ArgumentsError, TrainConfig, key_of_flag, parse_flags, setting_flags, setting_keys

DEFAULT_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
DEFAULT_RAY_VERSION = "2.58.0"

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


class ConfigError(pulumi.RunError):
    """A stack setting is wrong; the message says which key, what value, and how to fix it.

    Subclassing `pulumi.RunError` makes the Pulumi CLI print the message without a traceback.
    """


# What `pulumi up` trains unless the stack's `training.preset` says otherwise: AWS's reference job.
DEFAULT_TRAINING_PRESET = "smoke"
# Flags of `python -m training` that the program sets itself, and why the stack may not.
PROGRAM_FLAGS = {
    "--storage-path": "checkpoints go to the stack's S3 bucket",
    "--use-gpu": "every worker trains on a GPU of the GPU nodes",
    "--gpus-per-worker": "the program runs one worker per GPU",
    "--local": "the job runs on the cluster's Ray",
    "--launcher": "the job is submitted to the cluster's Ray",
}
# `ray job submit` joins the job's command line with `subprocess.list2cmdline` and Ray runs it
# with `shell=True` (ray/dashboard/modules/job/cli.py, job_supervisor.py), so a stack value must be
# a word the shell leaves as it is.
_SHELL_WORD = re.compile(r"[A-Za-z0-9._/:@=+,-]+")  # fullmatch: no newline
# Former `training` keys, with what replaced them.
RENAMED_TRAINING_KEYS = {
    "hsdp": "use hsdpReplicas: auto (shard inside a node, replicate across nodes) or hsdpReplicas: 1 (plain FSDP)",
}


@dataclass(frozen=True)
class TrainingSettings:
    """The training job run by `pulumi up` (the `training` object).

    `flags` are the stack's training settings as flags of `python -m training`, checked by that
    program's own parser; the other fields say how the program judges the run.
    """

    flags: tuple[str, ...] = ("--preset", DEFAULT_TRAINING_PRESET)
    expect_transport: str = "efa"
    timeout_minutes: int = 60


@dataclass(frozen=True)
class AwsIdentity:
    """Who Pulumi acts as (`aws:profile`, `aws:assumeRoles`): everything that talks to the cluster uses it too."""

    profile: str | None = None
    role_arn: str | None = None


@dataclass(frozen=True)
class StackSettings:
    """Every setting of one stack, validated; derived sizes live in `infra.sizing`."""

    region: str
    cluster_name: str = "eks-ray-train"
    kubernetes_version: str = "1.36"
    vpc_cidr: str = "10.0.0.0/16"
    system_node_type: str = "m7i.xlarge"
    system_node_count: int = 1
    gpu_node_type: str = "g6.12xlarge"
    gpu_node_count: int = 2
    gpu_az: str | None = None
    # `capacityReservationId`: an On-Demand Capacity Reservation or a Capacity Block for ML that the
    # GPU nodes launch into; it decides the GPU zone. The stack then makes no placement group (EC2
    # launches into a targeted reservation only where the placement matches): create the reservation
    # in a cluster placement group and the nodes join that group. An EKS node group update launches
    # new nodes before it removes old ones (up to twice the zone count), which a reservation sized to
    # the group cannot hold, so the GPU group updates with the MINIMAL strategy, one node replaced at
    # a time. AWS updates a Capacity Block's node group only at desired size 0.
    capacity_reservation_id: str | None = None
    image: str = DEFAULT_IMAGE
    ray_version: str = DEFAULT_RAY_VERSION
    namespace: str = "ray-train"
    worker_cpu: int = 40
    worker_memory: str = "160Gi"
    endpoint_public_access: bool = True
    endpoint_public_access_cidrs: tuple[str, ...] = ()
    admin_principal_arns: tuple[str, ...] = ()
    log_retention_days: int = 30
    # `pulumi destroy` empties the checkpoint bucket (every object version) only when asked to.
    checkpoints_force_destroy: bool = False
    vpc_flow_logs: bool = False
    train: bool = True
    benchmark: bool = False
    has_hf_token: bool = False
    training: TrainingSettings = field(default_factory=TrainingSettings)
    aws_identity: AwsIdentity = field(default_factory=AwsIdentity)

    @property
    def worker_memory_mib(self) -> int:
        return memory_mib(self.worker_memory)


# --- small parsers: each returns the typed value or raises ValueError with the reason ------------

# Each shape is checked with `fullmatch` (see platform_facts); _STS_SESSION is a prefix.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label: 63 at most
_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]*")
_IAM_PRINCIPAL = re.compile(r"arn:aws(-[a-z]+)*:iam::\d{12}:(user|role)/[\w+=,.@/-]{1,512}")
_STS_SESSION = re.compile(r"arn:aws(-[a-z]+)*:sts::(\d{12}):assumed-role/([\w+=,.@-]+)/")
_RESERVATION = re.compile(r"cr-[0-9a-f]{8,17}")
_K8S_VERSION = re.compile(r"1\.\d{2}")


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected true or false")


def _as_int(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected a whole number")
        try:
            number = int(str(value), 10)
        except ValueError:
            raise ValueError("expected a whole number") from None
        if number < minimum:
            raise ValueError(f"must be at least {minimum}")
        return number

    return parse


def _matching(pattern: re.Pattern[str], example: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"expected something like {example}")
        return value

    return parse


def _one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def _cidr(value: Any) -> str:
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError as err:
        raise ValueError(f"not a CIDR block ({err})") from None
    return str(network)


# VPC ranges AWS warns against: 172.17.0.0/16 is Docker's default bridge network, whose routes shadow
# VPC addresses on any host that runs Docker; 169.254.0.0/16 is link-local (instance metadata, the
# Amazon DNS server).
_VPC_CIDRS_TO_AVOID = {
    ipaddress.ip_network("172.17.0.0/16"): "the Docker bridge network",
    ipaddress.ip_network("169.254.0.0/16"): "link-local (instance metadata, DNS)",
}


def _vpc_cidr(value: Any) -> str:
    network = ipaddress.ip_network(_cidr(value))
    if not isinstance(network, ipaddress.IPv4Network) or not 16 <= network.prefixlen <= 20:
        raise ValueError("expected an IPv4 block between /16 and /20, e.g. 10.0.0.0/16")
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
    blocks = tuple(_cidr(item) for item in value)
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
    name = _matching(_CLUSTER_NAME, "eks-ray-train")(value)
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
    days = _as_int(1)(value)
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


def _memory_quantity(value: Any) -> str:
    """Kept as written (it goes into the pod spec), once it is known to parse."""
    memory_mib(str(value))
    return str(value)


# The `training` keys that are no flag of `python -m training` but say how the program judges the run.
_TRAINING_RUN_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "expectTransport": ("expect_transport", _one_of(*EXPECTABLE_TRANSPORTS)),
    "timeoutMinutes": ("timeout_minutes", _as_int(1)),
}

_STACK_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "clusterName": ("cluster_name", _cluster_name),
    "kubernetesVersion": ("kubernetes_version", _matching(_K8S_VERSION, '"1.36" (quote it in YAML)')),
    "vpcCidr": ("vpc_cidr", _vpc_cidr),
    "systemNodeType": ("system_node_type", _matching(INSTANCE_TYPE, "m7i.xlarge")),
    "systemNodeCount": ("system_node_count", _as_int(1)),
    "gpuNodeType": ("gpu_node_type", _matching(INSTANCE_TYPE, "g6.12xlarge")),
    "gpuNodeCount": ("gpu_node_count", _as_int(1)),
    "gpuAz": ("gpu_az", _matching(AVAILABILITY_ZONE, "us-east-2a")),
    "capacityReservationId": ("capacity_reservation_id", _matching(_RESERVATION, "cr-0123456789abcdef0")),
    "image": ("image", _image),
    "rayVersion": ("ray_version", _matching(re.compile(r"\d+\.\d+\.\d+"), "2.58.0")),
    "namespace": ("namespace", _matching(_NAME, "ray-train")),
    "workerCpu": ("worker_cpu", _as_int(1)),
    "workerMemory": ("worker_memory", _memory_quantity),
    "endpointPublicAccess": ("endpoint_public_access", _as_bool),
    "endpointPublicAccessCidrs": ("endpoint_public_access_cidrs", _cidr_list),
    "adminPrincipalArns": ("admin_principal_arns", _principal_arns),
    "logRetentionDays": ("log_retention_days", _log_retention),
    "checkpointsForceDestroy": ("checkpoints_force_destroy", _as_bool),
    "vpcFlowLogs": ("vpc_flow_logs", _as_bool),
    "train": ("train", _as_bool),
    "benchmark": ("benchmark", _as_bool),
    # Only its presence is kept here; the value stays a Pulumi secret (see `hf_token`).
    "hfToken": ("has_hf_token", lambda value: bool(value)),
}
KNOWN_KEYS = (*_STACK_KEYS, "training")


# Settings of the AWS provider (pulumi-aws's config schema) that people set in the project's namespace.
_AWS_PROVIDER_KEYS = ("region", "profile", "accessKey", "secretKey", "token", "assumeRole", "assumeRoles")


@functools.cache  # a botocore session loads its endpoint data: about 0.1 s a call otherwise
def _partition(region: str) -> str | None:
    """The AWS partition of a region, from botocore's endpoint data; None for a region it does not know."""
    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except botocore.exceptions.UnknownRegionError:
        return None


def _unknown_key_error(where: str, key: str, known: list[str]) -> ConfigError:
    if not where and key in _AWS_PROVIDER_KEYS:
        return ConfigError(
            f"config key '{PROJECT}:{key}' is a setting of the AWS provider: set 'aws:{key}' instead "
            f"(`pulumi config rm {key}`, then `pulumi config set aws:{key} ...`)"
        )
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"
    return ConfigError(f"unknown config key '{where}{key}': {hint}")


def _decode(value: Any) -> Any:
    """Pulumi hands object and list values over as JSON text; scalars stay strings."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _parse_fields(raw: Mapping[str, Any], table: dict, prefix: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in table:
            raise _unknown_key_error(prefix, key, list(table) + (["training"] if not prefix else []))
        attribute, parse = table[key]
        try:
            fields[attribute] = parse(_decode(value))
        except ValueError as err:
            raise ConfigError(f"config key '{prefix}{key}' = {value!r}: {err}") from None
    return fields


def training_config(flags: Sequence[str]) -> TrainConfig:
    """The job's flags parsed as `python -m training` parses them on the cluster (whose paths are
    not looked up here); a `ConfigError` in the stack's key names otherwise."""
    try:
        return parse_flags(flags, paths_here=False)
    except ArgumentsError as err:
        named = re.sub(r"--[a-z][a-z0-9-]*", lambda flag: key_of_flag(flag.group(0)), err.reason)
        raise ConfigError(f"config key 'training': {named}") from None


def _training_flags(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Each key is the flag of the same name (`seqLen` is `--seq-len`), in the parser's order."""
    keys = setting_keys()
    stack_keys = [key for key, flag in keys.items() if flag not in PROGRAM_FLAGS]
    chosen: dict[str, tuple[str, list[str]]] = {}
    for key, value in raw.items():
        if key in RENAMED_TRAINING_KEYS:
            raise ConfigError(f"config key 'training.{key}' is no longer read: {RENAMED_TRAINING_KEYS[key]}")
        if key not in keys:
            raise _unknown_key_error("training.", key, [*stack_keys, *_TRAINING_RUN_KEYS])
        flag = keys[key]
        if flag in PROGRAM_FLAGS:
            raise ConfigError(
                f"config key 'training.{key}' is set by the program ({PROGRAM_FLAGS[flag]}): remove it"
            )
        if flag in chosen:
            raise ConfigError(
                f"config keys 'training.{chosen[flag][0]}' and 'training.{key}' both set {flag}: keep one"
            )
        try:
            chosen[flag] = (key, setting_flags(key, value))
        except ArgumentsError as err:
            raise ConfigError(f"config key 'training.{key}' = {value!r}: {err.reason}") from None
        if not all(_SHELL_WORD.fullmatch(token) for token in chosen[flag][1]):
            raise ConfigError(
                f"config key 'training.{key}' = {value!r}: use letters, digits and . _ / : @ = + , - only "
                "(the job's command line passes through a shell on the cluster)"
            )
    chosen.setdefault("--preset", ("preset", ["--preset", DEFAULT_TRAINING_PRESET]))
    flags = tuple(
        token for flag in dict.fromkeys(keys.values()) if flag in chosen for token in chosen[flag][1]
    )
    training_config(flags)
    return flags


def _parse_training(raw: Mapping[str, Any]) -> TrainingSettings:
    run_keys = {key: value for key, value in raw.items() if key in _TRAINING_RUN_KEYS}
    knobs = {key: value for key, value in raw.items() if key not in _TRAINING_RUN_KEYS}
    return TrainingSettings(
        flags=_training_flags(knobs), **_parse_fields(run_keys, _TRAINING_RUN_KEYS, "training.")
    )


def _aws_identity(aws: Mapping[str, Any]) -> AwsIdentity:
    """The profile and role the AWS provider uses (`aws:` keys without the namespace), as the
    cluster's kubeconfig can use them; the one parser of those keys is `infra.aws_identity`."""
    try:
        profile, role_arn = AwsCredentialSettings.from_config(
            {f"aws:{key}": value for key, value in aws.items()}
        ).kubeconfig_identity()
    except AwsSettingsError as err:
        raise ConfigError(f"config key '{err.key}': {err.reason}") from None
    return AwsIdentity(profile=profile, role_arn=role_arn)


def parse_settings(
    raw: Mapping[str, Any], region: str | None, aws: Mapping[str, Any] | None = None
) -> StackSettings:
    """Validate the stack's `eks-ray-train:*` values (keys without the namespace) for `region`.

    `aws` holds the `aws:*` values that decide the identity (keys without the namespace).
    """
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
    values = dict(raw)
    training_raw = _decode(values.pop("training", {}))
    if not isinstance(training_raw, dict):
        raise ConfigError(
            "config key 'training' must be an object, e.g. training: {steps: 20, preset: smoke}"
        )
    settings = StackSettings(
        region=region,
        training=_parse_training(training_raw),
        aws_identity=_aws_identity(aws or {}),
        **_parse_fields(values, _STACK_KEYS, ""),
    )
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
            "run `pulumi config set --path 'endpointPublicAccessCidrs[0]' $(curl -s https://checkip.amazonaws.com)/32`, "
            "or set endpointPublicAccess: false to reach the cluster only from inside the VPC"
        )
    if not settings.endpoint_public_access:
        # EKS (and pulumi-eks) refuse publicAccessCidrs on a private endpoint; the list means nothing there.
        settings = replace(settings, endpoint_public_access_cidrs=())
    return settings


def stack_config_values(project: str = PROJECT) -> dict[str, Any]:
    """Every value the engine passed for the project's namespace, keyed without the namespace."""
    merged = {**pulumi.runtime.config.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{project}:"
    return {key[len(prefix) :]: value for key, value in merged.items() if key.startswith(prefix)}


def hf_token() -> pulumi.Output[str] | None:
    """The Hugging Face token for gated models, as a secret Output (never a plain string)."""
    return pulumi.Config(PROJECT).get_secret("hfToken")


def load_settings() -> StackSettings:
    """Read and validate the current stack's configuration."""
    settings = parse_settings(
        stack_config_values(), pulumi.Config("aws").get("region"), stack_config_values("aws")
    )
    if settings.has_hf_token and not pulumi.runtime.is_config_secret(f"{PROJECT}:hfToken"):
        raise ConfigError(
            "config key 'hfToken' is stored in plain text in the stack file: run "
            "`pulumi config set --secret hfToken <token>` (and revoke the token if the file was shared)"
        )
    return settings
