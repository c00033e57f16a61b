"""The contract the infrastructure (`infra`) and the workloads (`workloads`) keep, each term declared once.

Node labels and taints, extended resource names, Kubernetes object names, Ray's ports, the NCCL
transport vocabulary, which stacks are dev stacks, and the shape rules for regions, zones, instance
types, memory quantities and image references. Both sides import them from here, so `infra` never
imports `workloads`. Importing it needs only the standard library (the NCCL log check, which
imports the transports, runs anywhere); reading a quantity also needs the `kubernetes` client. No
Pulumi, torch or Ray. The policy pack runs in its own virtualenv and keeps copies; `tests/policy/`
checks they equal these.
"""

from __future__ import annotations

import re
from decimal import Decimal

# The Pulumi project's name (Pulumi.yaml), which is also the namespace of its stack config keys.
PROJECT = "eks-ray-train"
# On every Kubernetes object the program makes (the recommended `app.kubernetes.io/part-of` label).
PART_OF_LABELS = {"app.kubernetes.io/part-of": PROJECT}


def is_dev_stack(stack: str) -> bool:
    """Dev stacks are thrown away freely: `dev`, `dev-<anything>`, `<anything>-dev`. Every other stack
    runs its images by digest, and the policy pack asks it for the cluster's deletion protection."""
    return stack == "dev" or stack.startswith("dev-") or stack.endswith("-dev")


# --- node labels, taints and extended resources ------------------------------------------------

# Extended resources registered by the NVIDIA device plugin and the AWS EFA device plugin.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# Set on GPU nodes by the EKS NVIDIA AMI (and by the program's node group labels).
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# The program's own node role label: the system node group and the EFA GPU node group.
ROLE_LABEL = "role"
SYSTEM_LABELS = {ROLE_LABEL: "system"}
GPU_LABELS = {ROLE_LABEL: "gpu-worker", GPU_PRESENT_LABEL: "true"}
SYSTEM_NODE_SELECTOR = {ROLE_LABEL: SYSTEM_LABELS[ROLE_LABEL]}
GPU_NODE_SELECTOR = {ROLE_LABEL: GPU_LABELS[ROLE_LABEL]}
# GPU nodes are tainted with the resource name, the key the NVIDIA device plugin chart tolerates by
# default (its values.yaml `tolerations`).
# The EKS API spells the effect NO_SCHEDULE (nodegroup Taint); Kubernetes spells it NoSchedule.
GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NO_SCHEDULE"}
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# On every container that asks for no GPU. The EKS AL2023 NVIDIA AMI makes the NVIDIA container
# runtime containerd's default, and images built on nvidia/cuda set NVIDIA_VISIBLE_DEVICES=all, so
# such a container would be handed every GPU of its node (NVIDIA/k8s-device-plugin issues 61 and 87)
# and fail to start where their NVML does not initialise; `void` makes the runtime act as runc,
# neither GPUs nor driver libraries (NVIDIA Container Toolkit, "Specialized Configurations with
# Docker", GPU Enumeration).
NO_GPU_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}

# --- Kubernetes object names ------------------------------------------------------------------

# The Ray pods' service account; the checkpoint bucket's IRSA role trusts exactly this name.
RAY_SERVICE_ACCOUNT = "ray-train"

# --- Ray ---------------------------------------------------------------------------------------

# Ports of the Ray head (Ray's defaults, named as KubeRay names them): GCS, dashboard/Jobs API, client.
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}

# --- NCCL transports ---------------------------------------------------------------------------

# What `workloads.nccl_transport` can conclude from NCCL's INFO log.
TRANSPORTS = ("efa", "socket", "ib", "intra-node", "unknown")
# What a run may be expected to use; "unknown" is a verdict, never an expectation.
EXPECTABLE_TRANSPORTS = tuple(t for t in TRANSPORTS if t != "unknown")

# --- shapes of AWS names ------------------------------------------------------------------------
# Checked with `fullmatch`, never `match`: `$` also matches before a trailing newline, and a value
# with a newline in it reaches shell command lines and Kubernetes names.

# Region names of every AWS partition (botocore's endpoints.json `regionRegex`: e.g. us-east-2,
# us-gov-west-1, cn-north-1, eusc-de-east-1).
_REGION_SHAPE = r"[a-z]+(-[a-z]+)+-\d+"
REGION = re.compile(_REGION_SHAPE)
# An Availability Zone name is its region's name plus one letter (us-east-2a).
AVAILABILITY_ZONE = re.compile(rf"{_REGION_SHAPE}[a-z]")
# Instance types are `<family>.<size>` (g6.12xlarge, p5.48xlarge, u-6tb1.metal).
INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")

# --- values --------------------------------------------------------------------------------------

_MIB = Decimal(2**20)


def memory_mib(text: str) -> int:
    """A Kubernetes memory quantity (e.g. `160Gi`, `163840Mi`, `171798691840`) in MiB, rounded down.

    Parsed by the Kubernetes client's `parse_quantity`. It also takes blanks, which the API server
    refuses, and values under 1 MiB, in which no pod runs: both are refused here.
    """
    from kubernetes.utils import parse_quantity  # here, so that importing the contract needs no client

    try:
        number = parse_quantity(text) if text == text.strip() and " " not in text else None
    except ValueError:
        number = None
    if number is None or not number.is_finite() or number < _MIB:
        raise ValueError(f"{text!r} is not a Kubernetes memory quantity such as 160Gi or 163840Mi")
    return int(number / _MIB)


# What follows `@` in a digest reference: `<algorithm>:<hex>` (OCI image spec, descriptor digests).
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


def image_pin_problem(image: str) -> str | None:
    """Why an image reference is not pinned (no tag, or `latest`), or None when it has a tag or digest.

    Pinned images make every node run the same bits; an untagged reference means `latest`.
    """
    name, at, digest = image.partition("@")
    if at:
        return None if _DIGEST.fullmatch(digest) else "has a malformed digest"
    last_segment = name.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return "has no tag (so it means latest)"
    if last_segment.rsplit(":", 1)[1] == "latest":
        return "is tagged latest"
    return None


# A sha256 digest, the algorithm registries compute manifests' digests with: `sha256:` and 64
# lowercase hex digits (OCI image spec, descriptor.md, "Registered algorithms").
_SHA256_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


def image_digest_problem(image: str) -> str | None:
    """Why an image reference does not name its bits by a sha256 digest, or None when it does.

    A tag can be moved by its publisher to other bits (AWS's `train-ml-cuda-v1.1` follows patch
    releases), so a node replaced later may pull other bits than the others run; a digest cannot.
    """
    _, at, digest = image.partition("@")
    if not at:
        return "is a tag, which its publisher can move to other bits"
    if not _SHA256_DIGEST.fullmatch(digest):
        return "has a digest other than sha256:<64 lowercase hex digits>"
    return None
