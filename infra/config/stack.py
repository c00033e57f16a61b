"""The stack's keys, declared once, and `parse_settings`, the one way in from raw values to settings.

Every key of the `eks-ray-train` namespace is declared here (`StackKeys`: name, type, default,
parser, the docs' description). A bad value or an unknown key raises `ConfigError`, whose message
names the key, the value and the fix, so `pulumi preview` stops before any resource exists.
Parsing is a pure function of a dict (`parse_settings`), so tests exercise it without a Pulumi
engine; `infra.config.pulumi_source.load_settings` only gathers that dict from the stack. Each key's
parser is in `infra.config.key_parsers`, the `aws:` keys in `infra.config.aws_keys`, and the rules
across keys in `infra.config.cross_keys`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config.aws_keys import AwsIdentity, aws_identity, check_keys, region_of
from infra.config.cross_keys import RAY_TOKEN_AUTH_SINCE, across_keys
from infra.config.key_parsers import (
    AUTONAME_SUFFIX_LENGTH,
    CLUSTER_NAME_MAX,
    CLUSTER_ROLE_SUFFIXES,
    DEFAULT_IMAGE,
    DEFAULT_KUBERNETES_VERSION,
    DEFAULT_RAY_VERSION,
    IAM_ROLE_NAME_LIMIT,
    K8S_VERSION,
    LOG_RETENTION_DAYS,
    NODES_PER_NODE_GROUP_MAX,
    PUBLIC_ACCESS_CIDRS_MAX,
    RESERVATION_ID,
    RFC1123_LABEL,
    VPC_CIDRS_TO_AVOID,
    VPC_PREFIX_LENGTHS,
    parse_cidr_list,
    parse_cluster_name,
    parse_image,
    parse_log_retention,
    parse_memory_quantity,
    parse_node_count,
    parse_principal_arns,
    parse_vpc_cidr,
)
from infra.config.parsing import ConfigError, as_bool, as_int, key_names, matching, one_of, validated
from infra.config.training_settings import TrainingSettings, parse_training
from platform_contract import AVAILABILITY_ZONE, INSTANCE_TYPE, memory_mib

# Besides its own names, the names of the key parsers and of the `aws:` keys its readers use.
__all__ = [
    "CLUSTER_NAME_MAX",
    "DEFAULT_IMAGE",
    "GPU_NODES_AFTER_TRAINING",
    "KEEP",
    "REGION_KEY_DESCRIPTION",
    "RELEASE",
    "AwsIdentity",
    "ConfigError",
    "StackKeys",
    "StackSettings",
    "parse_settings",
]


# `repinImages`: a short label, such as a date.
REPIN_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
# What becomes of the GPU nodes after the run (`gpuNodesAfterTraining`); the first is the default.
KEEP, RELEASE = "keep", "release"
GPU_NODES_AFTER_TRAINING = (KEEP, RELEASE)


_STRICT_KEYS = ConfigDict(
    frozen=True, strict=True, alias_generator=to_camel, validate_by_name=True, validate_by_alias=True
)


class StackKeys(BaseModel):
    """Every key of the project's namespace, declared once: its camelCase name (the alias), type,
    default, the parser whose `ValueError` names the reason, and the description the docs' key
    table is generated from (`python -m tools docs`)."""

    model_config = _STRICT_KEYS

    cluster_name: Annotated[str, BeforeValidator(parse_cluster_name)] = Field(
        default="eks-ray-train",
        description=f"EKS cluster name; at most {CLUSTER_NAME_MAX} characters (IAM role names stop at {IAM_ROLE_NAME_LIMIT}, and pulumi-eks names the cluster's role `<clusterName>{CLUSTER_ROLE_SUFFIXES[0]}` plus a random suffix of {AUTONAME_SUFFIX_LENGTH} characters)",
    )
    kubernetes_version: Annotated[
        str, BeforeValidator(matching(K8S_VERSION, f'"{DEFAULT_KUBERNETES_VERSION}" (quote it in YAML)'))
    ] = Field(
        default=DEFAULT_KUBERNETES_VERSION,
        description=f'EKS version; quote it in YAML (`"{DEFAULT_KUBERNETES_VERSION}"`), or it becomes the number {DEFAULT_KUBERNETES_VERSION}. The preview asks EKS which versions it offers in the region (`eks:DescribeClusterVersions`), refuses any other, and warns about one in extended support (billed at a higher rate)',
    )
    vpc_cidr: Annotated[str, BeforeValidator(parse_vpc_cidr)] = Field(
        default="10.0.0.0/16",
        description=f"VPC range, /{VPC_PREFIX_LENGTHS[0]} to /{VPC_PREFIX_LENGTHS[1]}; not overlapping "
        + ", or ".join(f"{block}, {why}" for block, why in VPC_CIDRS_TO_AVOID.items()),
    )
    system_node_type: Annotated[str, BeforeValidator(matching(INSTANCE_TYPE, "m7i.xlarge"))] = Field(
        default="m7i.xlarge",
        description="instance type of the system node group (KubeRay operator, CoreDNS, Ray head); x86_64, as its AMI (`AL2023_x86_64_STANDARD`)",
    )
    system_node_count: Annotated[int, BeforeValidator(parse_node_count)] = Field(
        default=1,
        description=f"system nodes; at most {NODES_PER_NODE_GROUP_MAX} (EKS's default quota of nodes per managed node group)",
    )
    gpu_node_type: Annotated[str, BeforeValidator(matching(INSTANCE_TYPE, "g6.12xlarge"))] = Field(
        default="g6.12xlarge",
        description="GPU instance type; must support EFA and be x86_64, as its AMI (`AL2023_x86_64_NVIDIA`)",
    )
    gpu_node_count: Annotated[int, BeforeValidator(parse_node_count)] = Field(
        default=2,
        description=f"GPU nodes, one Ray worker pod each; at most {NODES_PER_NODE_GROUP_MAX} (EKS's default quota of nodes per managed node group). One node reaches no network transport, so with `1` the run must expect `intra-node`",
    )
    gpu_az: Annotated[str | None, BeforeValidator(matching(AVAILABILITY_ZONE, "us-east-2a"))] = Field(
        default=None,
        description="the one zone of the GPU nodes; when unset: the capacity reservation's zone, else the first zone (by name) offering both node types",
    )
    capacity_reservation_id: Annotated[
        str | None, BeforeValidator(matching(RESERVATION_ID, "cr-0123456789abcdef0"))
    ] = Field(
        default=None,
        description="launch the GPU nodes into this On-Demand Capacity Reservation or Capacity Block for ML (told apart by its `ReservationType`); it decides the GPU zone. The stack then creates no placement group: create the reservation in a cluster placement group and the nodes launch into that group. The GPU node group then updates with the MINIMAL strategy (each node is terminated before its replacement launches); see [operations](operations/capacity-reservations.md)",
    )
    image: Annotated[str, BeforeValidator(parse_image)] = Field(
        default=DEFAULT_IMAGE,
        description=f"image of the Ray head and workers (AWS's Ray Train container: Ray {DEFAULT_RAY_VERSION}, PyTorch 2.13.0, NCCL with aws-ofi-nccl): a tag other than latest, or a digest (`<repository>[:<tag>]@sha256:<digest>`). Every stack but a dev one (`dev`, `dev-*`, `*-dev`) runs it by the digest the preview reads from its registry at the first deploy, kept until `image` or `repinImages` changes ([operations](operations/preview-checks.md#the-images)). A digest given runs as it is; a dev stack runs the tag, and the preview warns",
    )
    repin_images: Annotated[str | None, BeforeValidator(matching(REPIN_SHAPE, "2026-12-06"))] = Field(
        default=None,
        description="outside dev, a value other than the one recorded with the stack's image digests (`pulumi stack output images`), a date say, makes the next preview read every image tag's digest anew (`image`'s and the three charts') instead of keeping the recorded ones, which is how a stack takes the bits a tag was moved to; later previews keep the new ones. Up to 64 letters, digits, `.`, `_`, `:` and `-`",
    )
    ray_version: Annotated[
        str, BeforeValidator(matching(re.compile(r"\d+\.\d+\.\d+"), DEFAULT_RAY_VERSION))
    ] = Field(
        default=DEFAULT_RAY_VERSION,
        description=f"Ray version of the image (KubeRay needs it); refused when the image says another (the default image carries Ray {DEFAULT_RAY_VERSION}, and Ray's own images name theirs in the tag: `rayproject/ray:{DEFAULT_RAY_VERSION}-py311-gpu`), and below {RAY_TOKEN_AUTH_SINCE}, which lacks the token authentication the RayCluster turns on",
    )
    namespace: Annotated[str, BeforeValidator(matching(RFC1123_LABEL, "ray-train"))] = Field(
        default="ray-train", description="Kubernetes namespace of the RayCluster"
    )
    worker_cpu: Annotated[int, BeforeValidator(as_int(1))] = Field(
        default=40, description="CPU of a worker pod (requests = limits); must fit the node"
    )
    worker_memory: Annotated[str, BeforeValidator(parse_memory_quantity)] = Field(
        default="160Gi", description="memory of a worker pod (requests = limits); must fit the node"
    )
    endpoint_public_access: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=True,
        description="public Kubernetes API endpoint, limited to `endpointPublicAccessCidrs` (the private one is always on). Every `pulumi up` reaches the cluster through the API from the machine it runs on, so `false` is taken only for a cluster that already runs and whose private endpoint this machine reaches on 443; the preview refuses it otherwise, and on a stack not yet deployed ([operations](operations/changing-a-live-stack.md#a-private-api-endpoint))",
    )
    endpoint_public_access_cidrs: Annotated[tuple[str, ...], BeforeValidator(parse_cidr_list)] = Field(
        default=(),
        description=f"who may reach the public API endpoint; required while it is public, refused while it is not; refused: blocks that together cover every address (`0.0.0.0/0`, its halves), private and other non-public ranges (RFC 1918, 100.64.0.0/10, loopback, link-local), more than {PUBLIC_ACCESS_CIDRS_MAX} blocks (EKS's limit per cluster)",
    )
    admin_principal_arns: Annotated[tuple[str, ...], BeforeValidator(parse_principal_arns)] = Field(
        default=(),
        description="IAM user or role ARNs that get cluster-admin access (an EKS access entry with `AmazonEKSClusterAdminPolicy`, cluster scope), e.g. `pulumi config set --path 'adminPrincipalArns[0]' arn:aws:iam::<account>:role/<name>`. Leave out the identity that creates the cluster: it already has an entry, and listing it fails with `ResourceInUseException` (the preview warns). STS session ARNs are refused: give the role's own ARN",
    )
    log_retention_days: Annotated[int, BeforeValidator(parse_log_retention)] = Field(
        default=30,
        description=f"days CloudWatch keeps the control-plane logs; one of CloudWatch's values: {', '.join(map(str, LOG_RETENTION_DAYS))}. The program creates the log group `/aws/eks/<clusterName>/cluster` itself, before the cluster",
    )
    # `pulumi destroy` empties the checkpoint bucket (every object version) only when asked to.
    checkpoints_force_destroy: Annotated[bool, BeforeValidator(as_bool)] = Field(
        default=False,
        description="let `pulumi destroy` delete the checkpoint bucket with everything in it, every object version included; off, the destroy stops at a bucket that still holds checkpoints, which keeps its policy, encryption and other guards, and its KMS key stays enabled. Destroy reads the value recorded by the last `pulumi up`: set it, run `pulumi up`, then `pulumi destroy` ([operations](operations/tearing-down.md))",
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
    """Every setting of one stack, validated; derived sizes live in `infra.aws_rules.sizing`."""

    region: str
    aws_identity: AwsIdentity = AwsIdentity()

    @property
    def worker_memory_mib(self) -> int:
        return memory_mib(self.worker_memory)


# `aws:region` is the AWS provider's key, read with the project's keys; the docs list it first.
REGION_KEY_DESCRIPTION = "region of the stack (the `aws` provider's own key); a region of the `aws` partition: `aws-cn`, `aws-us-gov` and other partitions are refused (the IAM policy ARNs and the default image are the `aws` partition's)"


def parse_settings(
    raw: Mapping[str, Any], region: str | None, aws: Mapping[str, Any] | None = None, *, stack: str
) -> StackSettings:
    """Validate the stack's `eks-ray-train:*` values (keys without the namespace) for `region`.

    `aws` holds the `aws:*` values that decide the identity (keys without the namespace); `stack`
    is the stack's name, which says whether it is a dev stack (`platform_contract.is_dev_stack`).
    """
    region = region_of(region)
    check_keys(raw, key_names(StackKeys))
    settings = validated(StackSettings, raw, region=region, aws_identity=aws_identity(aws or {}))
    return across_keys(settings, stack)
