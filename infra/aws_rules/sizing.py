"""Instance facts (`ec2:DescribeInstanceTypes`, read at preview by
`infra.preflight.reads.instance_types`) and the pod sizes derived from them, computed once and
passed down.

The GPU count of the node is the single source for Ray's `num-gpus` and the pod's
`nvidia.com/gpu` request; the EFA interface count feeds both the launch template and the
`vpc.amazonaws.com/efa` request. Nothing here is typed twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.config.stack import ConfigError, StackSettings


@dataclass(frozen=True)
class InstanceFacts:
    """What one EC2 instance type offers, as `ec2:DescribeInstanceTypes` reports it."""

    instance_type: str
    vcpus: int
    memory_mib: int
    gpus: int
    gpu_name: str | None
    gpu_memory_mib: int
    efa_supported: bool
    efa_interfaces: int
    network_cards: int
    max_pods: int
    # `ProcessorInfo.SupportedArchitectures`: x86_64, arm64 (Graviton), x86_64_mac, arm64_mac.
    architectures: tuple[str, ...] = ("x86_64",)
    ipv4_per_interface: int = 30
    # `NetworkInfo.NetworkPerformance`: "40 Gigabit", "4x 100 Gigabit" (the planner's line rate).
    network_performance: str = ""


def eks_max_pods(network_interfaces: int, ipv4_per_interface: int) -> int:
    """Pods the VPC CNI fits on a node without prefix delegation (EKS's own formula)."""
    return network_interfaces * (ipv4_per_interface - 1) + 2


@dataclass(frozen=True)
class WorkerSizing:
    """One Ray worker pod per GPU node: the numbers the RayCluster and the checks share."""

    gpus: int
    efa_interfaces: int
    cpu: int
    memory: str
    node_allocatable_cpu_millis: int
    node_allocatable_memory_mib: int


def kubelet_reserved_cpu_millis(vcpus: int) -> int:
    """EKS AMI kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above."""
    tiers = ((1, 60), (1, 10), (2, 5), (math.inf, 2.5))
    reserved, left = 0.0, float(vcpus)
    for cores, millis_per_core in tiers:
        used = min(left, cores)
        reserved += used * millis_per_core
        left -= used
        if left <= 0:
            break
    return math.ceil(reserved)


def kubelet_reserved_memory_mib(max_pods: int) -> int:
    """EKS AMI kube-reserved memory (255 MiB + 11 MiB a pod) plus the 100 MiB hard eviction threshold."""
    return 255 + 11 * max_pods + 100


# Requests of the daemonsets on a GPU node (vpc-cni, kube-proxy, device plugins, pod identity, the
# EFA counter reader; with `observability`, the CloudWatch agent and DCGM exporter, 250m CPU and
# 128 MiB each in the add-on chart's values.yaml) with room to spare; they add up to well under this.
DAEMONSET_CPU_MILLIS = 1000
DAEMONSET_MEMORY_MIB = 2048


def size_workers(settings: StackSettings, gpu_node: InstanceFacts) -> WorkerSizing:
    """Derive the worker pod from the GPU instance type, or fail with the numbers that do not fit."""
    if gpu_node.gpus < 1:
        raise ConfigError(
            f"config key 'gpuNodeType' = {gpu_node.instance_type!r} has no GPU: pick a GPU type such as g6.12xlarge"
        )
    cpu_millis = gpu_node.vcpus * 1000 - kubelet_reserved_cpu_millis(gpu_node.vcpus) - DAEMONSET_CPU_MILLIS
    memory_mib = gpu_node.memory_mib - kubelet_reserved_memory_mib(gpu_node.max_pods) - DAEMONSET_MEMORY_MIB
    if settings.worker_cpu * 1000 > cpu_millis:
        raise ConfigError(
            f"config key 'workerCpu' = {settings.worker_cpu} does not fit a {gpu_node.instance_type} node: "
            f"{gpu_node.vcpus} vCPU minus kubelet and daemonset reservations leaves {cpu_millis // 1000}; "
            f"set workerCpu to {cpu_millis // 1000} or less"
        )
    if settings.worker_memory_mib > memory_mib:
        raise ConfigError(
            f"config key 'workerMemory' = {settings.worker_memory!r} does not fit a {gpu_node.instance_type} node: "
            f"{gpu_node.memory_mib // 1024} GiB minus kubelet and daemonset reservations leaves {memory_mib // 1024} GiB; "
            f"set workerMemory to {memory_mib // 1024}Gi or less"
        )
    return WorkerSizing(
        gpus=gpu_node.gpus,
        efa_interfaces=gpu_node.efa_interfaces,
        cpu=settings.worker_cpu,
        memory=settings.worker_memory,
        node_allocatable_cpu_millis=cpu_millis,
        node_allocatable_memory_mib=memory_mib,
    )
