"""The RayCluster (KubeRay's custom resource): the head and the GPU worker group, and the hash of the spec its pods run."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

from infra.aws_rules.sizing import WorkerSizing
from platform_contract import (
    EFA_RESOURCE,
    GPU_NODE_SELECTOR,
    GPU_RESOURCE,
    GPU_TOLERATION,
    NO_GPU_ENV,
    PART_OF_LABELS,
    RAY_PORTS,
    SYSTEM_NODE_SELECTOR,
    memory_mib,
)
from training.config.drain_budget import DEFAULT_GRACE_S, RAY_STOP_MARGIN_S
from training.config.settings import NODE_NAME_ENV
from training.metrics.cloudwatch_metrics import CLUSTER_NAME_ENV
from workloads.efa_counter_reader import counters_url_env
from workloads.manifests.code_configmap import CODE_MOUNT, code_volume
from workloads.manifests.head_disruption_budget import SAFE_TO_EVICT_ANNOTATION
from workloads.manifests.secret import HF_TOKEN_MOUNT, HF_TOKEN_PATH_ENV, HF_TOKEN_VOLUME

# Ray's session folder (logs, which hold the transport evidence, and object spill). On an emptyDir,
# as in AWS's Ray sample, it outlives a container restart and stays off the overlay filesystem.
RAY_TMP_DIR = "/tmp/ray"
RAY_LOGS_VOLUME = "ray-logs"
# Each Ray pod's /dev/shm: a memory-backed emptyDir, sized from the pod's memory by one rule for the
# head and the workers (`shm_size`). Ray puts its object store in /dev/shm and, without a size given,
# makes it 30% of the memory it sees (the pod's limit: `DEFAULT_OBJECT_STORE_MEMORY_PROPORTION`,
# ray/_private/ray_constants.py; `resolve_object_store_memory`, ray/_private/utils.py); when /dev/shm
# is smaller, it puts the store in its temp folder, on disk, instead (`determine_plasma_store_config`,
# ray/_private/services.py), and asks for 1.1 times the store. Above 10**10 bytes Ray sizes the store
# to 95% of /dev/shm rather than the other way round (`REQUIRE_SHM_SIZE_THRESHOLD`), so past that a
# larger /dev/shm only lets the store take more of the pod's memory: the size stops at the workers'
# 32Gi (a 32Gi /dev/shm, 20% of a 160Gi worker, holds a 30.4 GiB store; NCCL and the data loaders
# share it). The volume counts against the pod's memory limit. Declared in the template, it is the
# pod's /dev/shm: KubeRay v1.7.0 adds its own (`shared-mem`, as large as the memory limit) only to a
# container with nothing mounted there (ray-operator/controllers/ray/common/pod.go, `addEmptyDir`).
SHM_VOLUME = "dshm"
SHM_MOUNT = {"name": SHM_VOLUME, "mountPath": "/dev/shm"}
RAY_OBJECT_STORE_SHARE_PERCENT = 30
RAY_SHM_HEADROOM_PERCENT = 110
SHM_MAX_MIB = 32 * 1024
# On both pod templates: the hash of the rendered RayCluster, so the training run can tell pods of
# the current spec from pods KubeRay has not replaced yet.
SPEC_HASH_ANNOTATION = "eks-ray-train/spec-hash"
# How a worker pod ends when its node is drained (an eviction, a scale-down, a node update or an EKS
# node repair) or the pod is deleted: the kubelet runs the container's preStop hook (none here), sends
# SIGTERM to its PID 1 and, once the pod's `terminationGracePeriodSeconds` have passed since the
# deletion, SIGKILL (Kubernetes docs, "Pod Lifecycle", Termination of Pods). PID 1 is `ray start
# --block`: KubeRay runs `ulimit ...; ray start ... --block` through `bash -c`, which execs the last
# command of its string. On SIGTERM Ray 2.58 marks the node draining with a deadline of
# RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S and waits up to that long before it stops the node's processes
# (ray/_private/node.py, `_drain_node_before_shutdown`); Ray Train's preemption watcher reads the
# drain and the job sees it in `ray.train.get_preemption_info()`, on which the loop checkpoints. An
# idle node (no job) ends its drain at once. The drain ends `RAY_STOP_MARGIN_S` before the kubelet's
# SIGKILL: Ray then stops each of the node's processes, one second each at most before it kills it
# (`_kill_process_impl`, `wait_timeout_seconds`), about half a dozen on a worker.
# The grace is sized by the preview from the drain's checkpoint (`training.config.drain_budget`:
# the node's share of the checkpoint at S3's rate, a write in flight, a margin); Ray's stop margin and
# the default for a stack without a training job are declared there too.
DRAIN_TIMEOUT_ENV = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
# The worker's node, from the downward API (Kubernetes docs, "Expose Pod Information to Containers
# Through Environment Variables"): a restart names it, and refuses a second fault in a row there.
NODE_NAME = {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
# NCCL through libfabric's EFA provider; INFO logs are what the transport check reads. NCCL_NET pins
# the network to the plugin's, so a node whose EFA or plugin fails stops at its first communicator
# ("Could not find network") instead of falling back to sockets unseen. aws-ofi-nccl 1.11 and earlier
# register as "AWS Libfabric"; later ones as "Libfabric", and rename themselves "AWS Libfabric" when
# NCCL_NET asks for that name (aws/aws-ofi-nccl src/nccl_ofi_interface_nvidia.cpp,
# `nvidia_plugin_name_fixup`): that name holds for every version an image may carry.
EFA_NCCL_ENV = {
    "FI_PROVIDER": "efa",
    "NCCL_NET_PLUGIN": "ofi",
    "NCCL_NET": "AWS Libfabric",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_DEBUG": "INFO",
}
# Every Ray container drops every capability and cannot escalate, under the runtime's default seccomp
# profile. EFA needs no capability: the device plugin hands the device over, and the memory libfabric
# registers is bounded by the container's locked-memory limit, which CAP_IPC_LOCK would lift. That
# capability is not in the runtime's default set and the Ray namespace's `baseline` level refuses to
# add it: the GPU nodes set the limit in their container runtime's base spec instead
# (`infra.resources.node_groups.CONTAINER_RLIMITS`), and readiness refuses a node whose pods get a
# low one. (KubeRay copies the Ray container's context to the init container it injects.)
RAY_POD_SECURITY_CONTEXT = {"seccompProfile": {"type": "RuntimeDefault"}}
RAY_CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
# Ray's token authentication, asked for explicitly so that Ray's default does not decide it (off in
# Ray 2.58; on for local clusters from 2.59 and for every cluster from 2.61, docs.ray.io). With
# `mode: token` and no `secretName`, KubeRay 1.7.0 creates a Secret named after the RayCluster
# (`utils.CheckName`: the name itself, up to 50 characters) holding a random token (32 bytes,
# base64) under `auth_token`, owned by the RayCluster (ray-operator/controllers/ray/
# raycluster_controller.go, `reconcileAuthSecret`, before any pod), and sets RAY_AUTH_MODE=token
# and RAY_AUTH_TOKEN from that Secret in the Ray container of every pod and in the workers'
# `wait-gcs-ready` init container (common/pod.go, `configureTokenAuth`); it refuses the mode below
# Ray 2.52.0 (utils/validation.go). The token never passes through the program, its state or outputs.
RAY_AUTH_OPTIONS = {"mode": "token"}
# The key of that Secret holding the token (ray-operator/controllers/ray/utils/constant.go,
# `RAY_AUTH_TOKEN_SECRET_KEY`).
RAY_AUTH_SECRET_KEY = "auth_token"


@dataclass(frozen=True)
class RayClusterSpec:
    """Inputs of the RayCluster; the worker numbers come from `infra.aws_rules.sizing.size_workers`."""

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
    # The cluster's name for the job's CloudWatch metrics (`training.metrics.cloudwatch_metrics`), while
    # the stack's `observability` key is on; None leaves the job publishing nothing.
    metrics_cluster_name: str | None = None
    # The worker pods' terminationGracePeriodSeconds, which holds a drain's checkpoint (the preview's
    # `DrainBudget.grace_s`); Ray's drain ends `RAY_STOP_MARGIN_S` before it.
    worker_grace_s: int = DEFAULT_GRACE_S
    head_cpu: str = "2"
    head_memory: str = "8Gi"


def _env(values: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": value} for key, value in values.items()]


def shm_size(memory: str) -> str:
    """The /dev/shm of a Ray pod with `memory` (a Kubernetes quantity): room for Ray's default object
    store with the headroom Ray asks for, 33% of the memory rounded up to a MiB, at most `SHM_MAX_MIB`."""
    share = RAY_OBJECT_STORE_SHARE_PERCENT * RAY_SHM_HEADROOM_PERCENT
    mib = min(-(-memory_mib(memory) * share // 10_000), SHM_MAX_MIB)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _shm_volume(memory: str) -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(memory)}}


def ray_auth_token_command(cluster_name: str, namespace: str) -> str:
    """The command that prints the RayCluster's Ray token (for the dashboard's sign-in, or a client
    through `kubectl port-forward`), read from the Secret KubeRay created: named after the RayCluster,
    since `utils.CheckName` keeps a name of at most 50 characters that starts with a letter."""
    return f"kubectl -n {namespace} get secret {cluster_name} -o jsonpath='{{.data.{RAY_AUTH_SECRET_KEY}}}' | base64 -d"


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

    Neither pod mounts a Kubernetes API token (`automountServiceAccountToken: false`): with
    `enableInTreeAutoscaling: false` nothing in them calls the API, and IRSA projects its own token.

    KubeRay (>= 1.6) replaces running pods on a spec change only with `upgradeStrategy: Recreate`:
    it then deletes every pod once the head pod's hash of the spec differs, so the next job runs on
    the new image, environment, resources and code file list. Both templates carry `spec_hash`.
    """
    manifest = _ray_cluster(spec)
    rendered = spec_hash(manifest)
    for template in _templates(manifest):
        template.setdefault("metadata", {}).setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = rendered
    return manifest


def _aws_env(spec: RayClusterSpec) -> list[dict]:
    """The AWS variables of every Ray container, head and workers."""
    # The region given outright: nodes answer instance-metadata calls from the host only (hop limit 1),
    # so an AWS SDK in a pod (S3 checkpoints) must not have to ask the metadata service for it.
    aws_env = _env({"AWS_REGION": spec.region, "AWS_DEFAULT_REGION": spec.region})
    # The fabric probe's driver runs in the head pod, the job's rank 0 in a worker pod: both publish.
    if spec.metrics_cluster_name:
        aws_env += _env({CLUSTER_NAME_ENV: spec.metrics_cluster_name})
    return aws_env


def _head_group(spec: RayClusterSpec, aws_env: list[dict]) -> dict:
    """The head pod: on a system node, without GPUs; it holds the code, the dashboard and the drivers."""
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
        "template": {
            # A cluster autoscaler leaves the head's node alone (`head_disruption_budget`).
            "metadata": {"annotations": {SAFE_TO_EVICT_ANNOTATION: "false"}},
            "spec": {
                "serviceAccountName": spec.service_account,
                "automountServiceAccountToken": False,
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "securityContext": copy.deepcopy(RAY_POD_SECURITY_CONTEXT),
                "containers": [
                    {
                        "name": "ray-head",
                        "image": spec.image,
                        "securityContext": copy.deepcopy(RAY_CONTAINER_SECURITY_CONTEXT),
                        "ports": [{"name": name, "containerPort": port} for name, port in RAY_PORTS.items()],
                        # No GPU asked for, none handed over (`NO_GPU_ENV`): the GPU image's NVML hook
                        # fails on a node without GPUs unless told there are none.
                        "env": [dict(NO_GPU_ENV), *aws_env, dict(HF_TOKEN_PATH_ENV)],
                        "resources": {
                            "requests": {"cpu": spec.head_cpu, "memory": spec.head_memory},
                            "limits": {"memory": spec.head_memory},
                        },
                        "volumeMounts": [
                            {"name": "training-code", "mountPath": CODE_MOUNT, "readOnly": True},
                            dict(SHM_MOUNT),
                            {"name": RAY_LOGS_VOLUME, "mountPath": RAY_TMP_DIR},
                            dict(HF_TOKEN_MOUNT),
                        ],
                    }
                ],
                # Ray's object store in memory, for what the driver and the fabric probe put there.
                "volumes": [
                    code_volume(spec.code_configmap, spec.code_files),
                    _shm_volume(spec.head_memory),
                    _ray_logs_volume(),
                    copy.deepcopy(HF_TOKEN_VOLUME),
                ],
            },
        },
    }


def _worker_group(spec: RayClusterSpec, aws_env: list[dict]) -> dict:
    """The GPU worker group: a fixed number of pods, each with its node's GPUs and EFA interfaces."""
    worker_resources = {
        "cpu": str(spec.worker.cpu),
        "memory": spec.worker.memory,
        GPU_RESOURCE: str(spec.worker.gpus),
        EFA_RESOURCE: str(spec.worker.efa_interfaces),
    }
    return {
        "groupName": "gpu-workers",
        "replicas": spec.worker_replicas,
        "minReplicas": spec.worker_replicas,
        "maxReplicas": spec.worker_replicas,
        # Ray's GPU count and the pod's GPU request are the same number.
        "rayStartParams": {"num-gpus": str(spec.worker.gpus)},
        "template": {
            "spec": {
                "serviceAccountName": spec.service_account,
                "automountServiceAccountToken": False,
                "nodeSelector": dict(GPU_NODE_SELECTOR),
                "tolerations": [GPU_TOLERATION],
                "terminationGracePeriodSeconds": spec.worker_grace_s,
                "securityContext": copy.deepcopy(RAY_POD_SECURITY_CONTEXT),
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": spec.image,
                        "securityContext": copy.deepcopy(RAY_CONTAINER_SECURITY_CONTEXT),
                        # The node's EFA counters come from its counter reader: the pod's own sysfs has none.
                        "env": [
                            *_env(EFA_NCCL_ENV),
                            *_env({DRAIN_TIMEOUT_ENV: str(spec.worker_grace_s - RAY_STOP_MARGIN_S)}),
                            *aws_env,
                            dict(HF_TOKEN_PATH_ENV),
                            *counters_url_env(),
                            copy.deepcopy(NODE_NAME),
                        ],
                        # Equal requests and limits: QoS Guaranteed, the node cannot be overcommitted.
                        "resources": {"requests": dict(worker_resources), "limits": dict(worker_resources)},
                        "volumeMounts": [
                            dict(SHM_MOUNT),
                            {"name": RAY_LOGS_VOLUME, "mountPath": RAY_TMP_DIR},
                            dict(HF_TOKEN_MOUNT),
                        ],
                    }
                ],
                # Ray's object store, NCCL and the data loaders use shared memory; the container default
                # of 64 MiB is too small.
                "volumes": [
                    _shm_volume(spec.worker.memory),
                    _ray_logs_volume(),
                    copy.deepcopy(HF_TOKEN_VOLUME),
                ],
            }
        },
    }


def _ray_cluster(spec: RayClusterSpec) -> dict:
    """The RayCluster before its pod templates carry the spec's hash (`ray_cluster`)."""
    aws_env = _aws_env(spec)
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
            "authOptions": dict(RAY_AUTH_OPTIONS),
            "enableInTreeAutoscaling": False,
            "headGroupSpec": _head_group(spec, aws_env),
            "workerGroupSpecs": [_worker_group(spec, aws_env)],
        },
    }


def _ray_logs_volume() -> dict:
    """On the node's disk, as Ray's own session folder would be, but per pod rather than per container."""
    return {"name": RAY_LOGS_VOLUME, "emptyDir": {}}
