"""The worker pods' sizes from the instance (`infra.aws_rules.sizing`): GPUs, EFA interfaces, CPU and
memory, and a size above the node refused with the numbers."""

from __future__ import annotations

import pytest

from infra.aws_rules.sizing import InstanceFacts, size_workers
from infra.config.stack import ConfigError
from tests.harness.stack_values import parse

G6_12XLARGE = InstanceFacts(
    "g6.12xlarge",
    vcpus=48,
    memory_mib=196_608,
    gpus=4,
    gpu_name="NVIDIA L4",
    gpu_memory_mib=91_552,
    efa_supported=True,
    efa_interfaces=1,
    network_cards=1,
    max_pods=234,
)


def test_worker_sizes_come_from_the_instance():
    worker = size_workers(parse(), G6_12XLARGE)
    assert (worker.gpus, worker.efa_interfaces, worker.cpu, worker.memory) == (4, 1, 40, "160Gi")
    assert worker.node_allocatable_cpu_millis < 48_000
    assert worker.node_allocatable_memory_mib < 196_608


def test_worker_cpu_above_the_node_fails_with_the_numbers():
    with pytest.raises(ConfigError) as raised:
        size_workers(parse(workerCpu="48"), G6_12XLARGE)
    message = str(raised.value)
    assert "'workerCpu' = 48 does not fit a g6.12xlarge node" in message
    assert "48 vCPU" in message and "set workerCpu to 46 or less" in message


def test_worker_memory_above_the_node_fails_with_the_numbers():
    with pytest.raises(
        ConfigError, match=r"'workerMemory' = '190Gi' does not fit .* set workerMemory to \d+Gi or less"
    ):
        size_workers(parse(workerMemory="190Gi"), G6_12XLARGE)


def test_gpu_type_without_gpus_fails():
    """An EFA type without GPUs passes the preflight's EFA check (`infra.preflight`); sizing refuses it."""
    no_gpu = InstanceFacts("c5n.18xlarge", 72, 196_608, 0, None, 0, True, 1, 1, 737)
    with pytest.raises(ConfigError, match="has no GPU"):
        size_workers(parse(), no_gpu)
