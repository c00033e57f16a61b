"""Kubernetes objects and Helm values as pure functions returning plain dicts.

Nothing here talks to Pulumi or a cluster, so tests validate every object against the real
schemas (Kubernetes core, the KubeRay CRD, the charts' values.yaml). The Pulumi wiring in
`workloads.addons` and `workloads.ray_cluster` only hands these dicts over.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.aws_facts.sizing import WorkerSizing
from platform_facts import (
    EFA_RESOURCE,
    GPU_NODE_SELECTOR,
    GPU_RESOURCE,
    GPU_TOLERATION,
    PART_OF_LABELS,
    RAY_PORTS,
    SYSTEM_NODE_SELECTOR,
)
from training.metrics.cloudwatch_facts import CLUSTER_NAME_ENV
from workloads.efa_counter_reader import counters_url_env

CODE_MOUNT = "/opt/eks-ray-train"
CODE_HASH_FILE = ".code-hash"
# Ray's session folder (logs, which hold the transport evidence, and object spill). On an emptyDir,
# as in AWS's Ray sample, it outlives a container restart and stays off the overlay filesystem.
RAY_TMP_DIR = "/tmp/ray"
RAY_LOGS_VOLUME = "ray-logs"
# On both pod templates: the hash of the rendered RayCluster, so the training run can tell pods of
# the current spec from pods KubeRay has not replaced yet.
SPEC_HASH_ANNOTATION = "eks-ray-train/spec-hash"
# NCCL through libfabric's EFA provider; INFO logs are what the transport check reads.
EFA_NCCL_ENV = {
    "FI_PROVIDER": "efa",
    "NCCL_NET_PLUGIN": "ofi",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_DEBUG": "INFO",
}
CONFIGMAP_LIMIT_BYTES = 1_000_000
HF_TOKEN_SECRET = "hf-token"
# Labels KubeRay puts on every pod of a RayCluster (its utils.RayClusterLabelKey, RayNodeTypeLabelKey).
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
# Pod Security Standards of the Ray namespace. The Ray pods meet `baseline` (no privilege, no host
# namespaces or paths; GPUs and EFA come as device-plugin resources). They miss `restricted` only by
# running as root, as AWS's Ray image does: `restricted` is enforced nowhere, but each pod that misses
# it is reported to whoever applies it (warn) and in the audit log (audit).
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
# What every Ray pod runs with: the runtime's default seccomp filter, no setuid escalation, and no
# capability at all. EFA needs none: the device plugin hands the device over, and the memory libfabric
# registers is bounded by the locked-memory limit containers inherit from the node's runtime, which
# CAP_IPC_LOCK would only lift; that capability is not in the runtime's default set, so the workers
# never had it (and `baseline` refuses to add it). (KubeRay copies the Ray container's context to the init container it injects.)
RAY_POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}
RAY_CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
# Gated models need a Hugging Face token; optional, so pods start the same without one.
HF_TOKEN_ENV = {
    "name": "HF_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token", "optional": True}},
}


@dataclass(frozen=True)
class Chart:
    """A pinned Helm chart and where it comes from."""

    name: str
    version: str
    repository: str
    namespace: str


NVIDIA_DEVICE_PLUGIN = Chart(
    "nvidia-device-plugin", "0.20.0", "https://nvidia.github.io/k8s-device-plugin", "kube-system"
)
# v0.5.30 is the newest release in the chart index of aws/eks-charts (checked 2026-08) and lists
# g6.12xlarge as supported; AWS's Ray Train sample names v0.5.32, which that index does not hold.
EFA_DEVICE_PLUGIN = Chart(
    "aws-efa-k8s-device-plugin", "v0.5.30", "https://aws.github.io/eks-charts", "kube-system"
)
KUBERAY_OPERATOR = Chart(
    "kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/", "kuberay"
)
# KubeRay's CRDs as its chart ships them in `crds/` (which Helm installs once and never upgrades),
# vendored unchanged from the tag of the pinned chart: the program applies them itself.
KUBERAY_CRD_DIR = Path(__file__).resolve().parent / "crds" / f"kuberay-v{KUBERAY_OPERATOR.version}"
KUBERAY_CRD_FILES = (
    "ray.io_rayclusters.yaml",
    "ray.io_raycronjobs.yaml",
    "ray.io_rayjobs.yaml",
    "ray.io_rayservices.yaml",
)
# pulumi-kubernetes: apply with `force`, taking over the fields another field manager (Helm, which
# created these CRDs on stacks deployed before the program owned them) set to other values.
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"
# The node label the EFA chart's DaemonSet matches against `supportedInstanceLabels.values`.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Amazon EKS replicates its add-on images to a registry in each region (EKS user guide, "View Amazon
# container image registries for Amazon EKS add-ons"): account 602401143452 in most regions, these
# accounts in the others. The EFA chart's default image is us-west-2's.
EKS_REGISTRY_ACCOUNT = "602401143452"
EKS_REGISTRY_ACCOUNTS = {
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-south-2": "900889452093",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-6": "333609536671",
    "ap-southeast-7": "121268973566",
    "ca-west-1": "761377655185",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "eu-central-2": "900612956339",
    "eu-south-1": "590381155156",
    "eu-south-2": "455263428931",
    "il-central-1": "066635153087",
    "me-central-1": "759879836304",
    "me-south-1": "558608220178",
    "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608",
}
EFA_DEVICE_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"


def nvidia_device_plugin_values() -> dict:
    """MOFED off (it fights the EFA plugin in 0.19.x); tolerate the GPU taint."""
    return {
        "mofedEnabled": False,
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, GPU_TOLERATION],
    }


def eks_registry(region: str) -> str:
    """The region's registry of EKS add-on images, pulled by the nodes over their own region's endpoint."""
    suffix = ".cn" if region.startswith("cn-") else ""
    return f"{EKS_REGISTRY_ACCOUNTS.get(region, EKS_REGISTRY_ACCOUNT)}.dkr.ecr.{region}.amazonaws.com{suffix}"


def efa_device_plugin_values(gpu_instance_type: str, region: str) -> dict:
    """Only on GPU nodes, which are tainted: the chart tolerates nothing by default; the image from
    the stack region's EKS registry rather than the chart's us-west-2 default (a cross-region pull).

    The chart's DaemonSet also requires the node's instance type to be in its own list of EFA types
    (`supportedInstanceLabels`); a type missing there would get no plugin pod and no EFA device,
    while the release still reports ready. The list is the configured GPU type (Helm replaces
    lists whole).
    """
    return {
        "image": {"repository": f"{eks_registry(region)}/{EFA_DEVICE_PLUGIN_REPOSITORY}"},
        "nodeSelector": dict(GPU_NODE_SELECTOR),
        "tolerations": [GPU_TOLERATION],
        "supportedInstanceLabels": {"keys": [INSTANCE_TYPE_LABEL], "values": [gpu_instance_type]},
    }


def kuberay_operator_values() -> dict:
    """The operator lives on the system node."""
    return {"nodeSelector": dict(SYSTEM_NODE_SELECTOR)}


@functools.cache
def _vendored_crd(path: Path) -> str:
    """The CRD file as JSON text: parsed once (4 MB of YAML take seconds), copied cheaply after."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return json.dumps(yaml.load(path.read_text(encoding="utf-8"), Loader=loader))


def kuberay_crds() -> list[dict]:
    """The operator's CRDs of the pinned version, as the program applies them (server-side, forced).

    Each is the vendored upstream file plus the annotation that lets the apply take the fields over
    from Helm on stacks where Helm created the CRD; the object (and every RayCluster) stays.
    """
    crds = []
    for file_name in KUBERAY_CRD_FILES:
        crd = json.loads(_vendored_crd(KUBERAY_CRD_DIR / file_name))
        crd["metadata"].setdefault("annotations", {})[PATCH_FORCE_ANNOTATION] = "true"
        crds.append(crd)
    return crds


def namespace(name: str) -> dict:
    """The Ray namespace, admitting pods that meet the `baseline` Pod Security Standard."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {**PART_OF_LABELS, **POD_SECURITY_LABELS}},
    }


def service_account(name: str, namespace_name: str, role_arn: object) -> dict:
    """The Ray pods' identity; IRSA maps it to the checkpoint bucket's role."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace_name,
            "annotations": {"eks.amazonaws.com/role-arn": role_arn},
        },
    }


def hf_token_secret(namespace_name: str, token: object) -> dict:
    """The token as a Kubernetes Secret, consumed by the Ray pods as `HF_TOKEN`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": HF_TOKEN_SECRET, "namespace": namespace_name},
        "type": "Opaque",
        "stringData": {"token": token},
    }


# --- the training code, shipped as a ConfigMap --------------------------------------------------

SHIPPED_SUFFIXES = {".py", ".json", ".txt", ".jsonl"}


def collect_code(root: Path, package: str = "training") -> dict[str, str]:
    """Files of the training package by POSIX path relative to `root` (sources and small data)."""
    files = {}
    for path in sorted((root / package).rglob("*")):
        if path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts:
            files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return files


def code_hash(files: dict[str, str]) -> str:
    """Content hash of the shipped code: a change triggers a new training run."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()[:16]


def _configmap_key(path: str) -> str:
    """ConfigMap keys allow no '/', so paths are flattened; volume items restore them."""
    return path.replace("/", "__")


def training_code_configmap(name: str, namespace_name: str, files: dict[str, str]) -> dict:
    """All shipped files plus the content hash, which the run checks before it submits."""
    data = {_configmap_key(path): content for path, content in files.items()}
    data[_configmap_key(CODE_HASH_FILE)] = code_hash(files)
    size = sum(len(key) + len(value.encode()) for key, value in data.items())
    if size > CONFIGMAP_LIMIT_BYTES:
        raise ValueError(
            f"the training code is {size} bytes; a ConfigMap holds at most {CONFIGMAP_LIMIT_BYTES}"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace_name,
            "labels": dict(PART_OF_LABELS),
        },
        "data": data,
    }


def code_volume(configmap_name: str, files: dict[str, str]) -> dict:
    return {
        "name": "training-code",
        "configMap": {
            "name": configmap_name,
            "items": [
                {"key": _configmap_key(path), "path": path} for path in sorted([*files, CODE_HASH_FILE])
            ],
        },
    }


# --- the RayCluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RayClusterSpec:
    """Inputs of the RayCluster; the worker numbers come from `infra.aws_facts.sizing.size_workers`."""

    name: str
    namespace: str
    image: str
    ray_version: str
    region: str
    worker_replicas: int
    worker: WorkerSizing
    service_account: str
    code_configmap: str
    code_files: dict[str, str]
    # The cluster's name for the job's CloudWatch metrics (`training.metrics.cloudwatch_facts`), while
    # the stack's `observability` key is on; None leaves the job publishing nothing.
    metrics_cluster_name: str | None = None
    head_cpu: str = "2"
    head_memory: str = "8Gi"
    shm_size: str = "32Gi"


def _env(values: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": value} for key, value in values.items()]


def _templates(manifest: dict) -> list[dict]:
    """The RayCluster's pod templates: the head's, then each worker group's."""
    spec = manifest["spec"]
    return [spec["headGroupSpec"]["template"], *(group["template"] for group in spec["workerGroupSpecs"])]


def spec_hash(manifest: dict) -> str:
    """Hash of the rendered RayCluster without its spec-hash annotations: what the pods run.

    It covers image, environment, resources, volumes (and the code files' list), node selection and
    replicas. The training run takes it as an input, so a change runs the job again, and waits for
    pods that carry it.
    """
    bare = copy.deepcopy(manifest)
    for template in _templates(bare):
        annotations = template.get("metadata", {}).get("annotations", {})
        annotations.pop(SPEC_HASH_ANNOTATION, None)
        if not annotations:
            template.get("metadata", {}).pop("annotations", None)
        if template.get("metadata") == {}:
            template.pop("metadata")
    return hashlib.sha256(json.dumps(bare, sort_keys=True).encode()).hexdigest()[:16]


def ray_cluster(spec: RayClusterSpec) -> dict:
    """Head on the system node (no GPU, no external Service), one GPU worker pod per GPU node.

    KubeRay (>= 1.6) replaces running pods on a spec change only with `upgradeStrategy: Recreate`:
    it then deletes every pod once the head pod's hash of the spec differs, so the next job runs on
    the new image, environment, resources and code file list. Both templates carry `spec_hash`.
    """
    manifest = _ray_cluster(spec)
    rendered = spec_hash(manifest)
    for template in _templates(manifest):
        template.setdefault("metadata", {}).setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = rendered
    return manifest


def _ray_cluster(spec: RayClusterSpec) -> dict:
    # The region given outright: nodes answer instance-metadata calls from the host only (hop limit 1),
    # so an AWS SDK in a pod (S3 checkpoints) must not have to ask the metadata service for it.
    aws_env = _env({"AWS_REGION": spec.region, "AWS_DEFAULT_REGION": spec.region})
    # The fabric probe's driver runs in the head pod, the job's rank 0 in a worker pod: both publish.
    if spec.metrics_cluster_name:
        aws_env += _env({CLUSTER_NAME_ENV: spec.metrics_cluster_name})
    worker_resources = {
        "cpu": str(spec.worker.cpu),
        "memory": spec.worker.memory,
        GPU_RESOURCE: str(spec.worker.gpus),
        EFA_RESOURCE: str(spec.worker.efa_interfaces),
    }
    head = {
        "serviceType": "ClusterIP",
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
        "template": {
            "spec": {
                "serviceAccountName": spec.service_account,
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "securityContext": copy.deepcopy(RAY_POD_SECURITY_CONTEXT),
                "containers": [
                    {
                        "name": "ray-head",
                        "image": spec.image,
                        "securityContext": copy.deepcopy(RAY_CONTAINER_SECURITY_CONTEXT),
                        "ports": [{"name": name, "containerPort": port} for name, port in RAY_PORTS.items()],
                        # The GPU image's NVML hook fails on a node without GPUs unless told there are none.
                        "env": [*_env({"NVIDIA_VISIBLE_DEVICES": "void"}), *aws_env, HF_TOKEN_ENV],
                        "resources": {
                            "requests": {"cpu": spec.head_cpu, "memory": spec.head_memory},
                            "limits": {"memory": spec.head_memory},
                        },
                        "volumeMounts": [
                            {"name": "training-code", "mountPath": CODE_MOUNT, "readOnly": True},
                            {"name": RAY_LOGS_VOLUME, "mountPath": RAY_TMP_DIR},
                        ],
                    }
                ],
                "volumes": [code_volume(spec.code_configmap, spec.code_files), _ray_logs_volume()],
            }
        },
    }
    workers = {
        "groupName": "gpu-workers",
        "replicas": spec.worker_replicas,
        "minReplicas": spec.worker_replicas,
        "maxReplicas": spec.worker_replicas,
        # Ray's GPU count and the pod's GPU request are the same number.
        "rayStartParams": {"num-gpus": str(spec.worker.gpus)},
        "template": {
            "spec": {
                "serviceAccountName": spec.service_account,
                "nodeSelector": dict(GPU_NODE_SELECTOR),
                "tolerations": [GPU_TOLERATION],
                "securityContext": copy.deepcopy(RAY_POD_SECURITY_CONTEXT),
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": spec.image,
                        "securityContext": copy.deepcopy(RAY_CONTAINER_SECURITY_CONTEXT),
                        # The node's EFA counters come from its counter reader: the pod's own sysfs has none.
                        "env": [*_env(EFA_NCCL_ENV), *aws_env, HF_TOKEN_ENV, *counters_url_env()],
                        # Equal requests and limits: QoS Guaranteed, the node cannot be overcommitted.
                        "resources": {"requests": dict(worker_resources), "limits": dict(worker_resources)},
                        "volumeMounts": [
                            {"name": "dshm", "mountPath": "/dev/shm"},
                            {"name": RAY_LOGS_VOLUME, "mountPath": RAY_TMP_DIR},
                        ],
                    }
                ],
                # NCCL and the data loaders use shared memory; the container default of 64 MiB is too small.
                "volumes": [
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
                    _ray_logs_volume(),
                ],
            }
        },
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": dict(PART_OF_LABELS),
        },
        "spec": {
            "rayVersion": spec.ray_version,
            "upgradeStrategy": {"type": "Recreate"},
            "enableInTreeAutoscaling": False,
            "headGroupSpec": head,
            "workerGroupSpecs": [workers],
        },
    }


def _ray_logs_volume() -> dict:
    """On the node's disk, as Ray's own session folder would be, but per pod rather than per container."""
    return {"name": RAY_LOGS_VOLUME, "emptyDir": {}}


def head_pod_labels(cluster_name: str) -> dict[str, str]:
    """Labels KubeRay puts on the head pod."""
    return {RAY_CLUSTER_LABEL: cluster_name, RAY_NODE_TYPE_LABEL: "head"}


def head_pod_selector(cluster_name: str) -> str:
    """Label selector of the head pod."""
    return ",".join(f"{key}={value}" for key, value in head_pod_labels(cluster_name).items())


def worker_pod_selector(cluster_name: str) -> str:
    return f"{RAY_CLUSTER_LABEL}={cluster_name},{RAY_NODE_TYPE_LABEL}=worker"


def head_network_policy(cluster_name: str, namespace_name: str) -> dict:
    """The Ray head admits connections from pods of its own namespace only.

    Its GCS, dashboard/Jobs API and client ports (`RAY_PORTS`) take jobs without authentication.
    Every port stays open to the namespace, since workers reach the head on many more (object and
    node managers, worker ports, the dashboard agent). Nothing outside it needs the head:
    - the KubeRay operator (namespace `kuberay`) queries the dashboard only for RayJobs and
      RayServices, never for a plain RayCluster (kuberay v1.7.0, ray-operator/controllers/ray);
    - kubelet probes come from the node, which the VPC CNI's policy agent always admits;
    - the training run reaches the head by `kubectl exec` (API server to kubelet), which network
      policies do not see, as does `kubectl port-forward` to the dashboard.
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{cluster_name}-head",
            "namespace": namespace_name,
            "labels": dict(PART_OF_LABELS),
        },
        "spec": {
            "podSelector": {"matchLabels": head_pod_labels(cluster_name)},
            "policyTypes": ["Ingress"],
            # An empty pod selector without a namespace selector: every pod of this namespace.
            "ingress": [{"from": [{"podSelector": {}}]}],
        },
    }
