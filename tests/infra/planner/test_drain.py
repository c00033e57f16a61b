"""The drain at preview: the line that states a node's checkpoint time, the worker pods' grace set from
it, and the refusal of a node's share that no grace EKS honours can hold."""

from __future__ import annotations

import pulumi
import pytest

from infra.config.parsing import ConfigError
from infra.planner.drain import size_the_drain
from infra.planner.planner import workload_of
from tests.harness.preview_queries import RAY_CLUSTER
from tests.harness.program import dev_config, run_program
from training.config.drain_budget import DEFAULT_GRACE_S, RAY_STOP_MARGIN_S
from workloads import manifests


def worker_pod(plan) -> dict:
    return plan.one(RAY_CLUSTER).inputs["spec"]["workerGroupSpecs"][0]["template"]["spec"]


def test_the_preview_states_the_drains_checkpoint_time_and_the_pods_get_the_grace_that_holds_it(monkeypatch):
    logged: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: logged.append(message))
    plan = run_program(dev_config())
    (line,) = [message for message in logged if message.startswith("drain: ")]
    # Qwen2.5-1.5B with AdamW, 18.5 GB over the dev stack's 2 nodes of 4 L4 each.
    assert line.startswith(
        "drain: a node's checkpoint of qwen2.5-1.5b is 9.3 GB, 4 ranks writing it to S3 at 85 MB/s each: about 27 s"
    )
    grace = int(line.rsplit("terminationGracePeriodSeconds ", 1)[1].split()[0])
    pod = worker_pod(plan)
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    assert pod["terminationGracePeriodSeconds"] == grace
    assert env[manifests.DRAIN_TIMEOUT_ENV] == str(grace - RAY_STOP_MARGIN_S)
    assert f"(Ray's drain {grace - RAY_STOP_MARGIN_S} s)" in line


def test_a_stack_that_trains_nothing_keeps_the_default_grace():
    plan = run_program(dev_config(train="false"))
    assert worker_pod(plan)["terminationGracePeriodSeconds"] == DEFAULT_GRACE_S


def test_a_nodes_share_no_grace_can_hold_is_refused_naming_gpu_node_count():
    """Qwen2.5-1.5B's 18.5 GB on one node with one rank: some 220 s to write, a grace past the 300 s EKS
    waits for a node's drain."""
    from infra.config.training_settings import training_config

    config = training_config(["--preset", "smoke"])
    assert workload_of(config) is not None
    with pytest.raises(ConfigError) as refused:
        size_the_drain(config, None, nodes=1, ranks_per_node=1)
    message = str(refused.value)
    assert message.startswith(
        "config key 'gpuNodeCount' = 1: a drain's checkpoint of qwen2.5-1.5b on each node (18.5 GB"
    )
    assert "more than the 300 s EKS waits for a node's drain" in message and "\n" not in message
