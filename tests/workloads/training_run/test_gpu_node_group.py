"""The GPU node group's size with `gpuNodesAfterTraining: release`, through the TrainingRun's runs."""

from __future__ import annotations

import datetime
from dataclasses import replace

import pytest

from infra.aws_rules.reservation_window import utc_text
from tests.harness.training_run_fakes import (
    EFA_JOB,
    FAKE_EPOCH,
    FakeCluster,
    FakeRayHead,
    failure_of,
    main_and_tcp_head,
    props,
    run_inputs,
    scripted,
)
from workloads.training_run import errors

# --- gpuNodesAfterTraining: release ---------------------------------------------------------------

RELEASE = {"gpu_nodes_after_training": "release", "node_group_name": "gpu-0a1b2c3", "gpu_node_count": 2}


def test_release_scales_the_group_out_before_the_run_and_to_zero_after_it():
    fake = FakeCluster(main_and_tcp_head())
    fake.node_group.desired = 0
    outs = fake.provider().create(props(run_inputs(**RELEASE))).outs
    assert outs["status"] == "SUCCEEDED" and fake.node_group.sizes == [2, 0]
    assert outs["gpu_nodes_released_at"] == utc_text(
        datetime.datetime.fromtimestamp(FAKE_EPOCH + fake.clock.now, datetime.UTC)
    )
    assert any("scaled from 0 to 2 nodes" in line for line in fake.logged)


def test_keep_never_sizes_the_group():
    fake = FakeCluster(main_and_tcp_head())
    outs = fake.provider().create(props(run_inputs(**{**RELEASE, "gpu_nodes_after_training": "keep"}))).outs
    assert outs["gpu_nodes_released_at"] is None and fake.node_group.sizes == []


def test_a_failed_job_is_the_verdict_and_releases_the_nodes_too():
    fake = FakeCluster(main_and_tcp_head(statuses=["PENDING", "RUNNING", "FAILED"], message="OOM"))
    with pytest.raises(errors.TrainingRunError):
        fake.provider().create(props(run_inputs(**RELEASE)))
    assert fake.node_group.sizes == [0]


def test_a_job_left_running_at_the_timeout_keeps_its_nodes_and_says_so():
    head = FakeRayHead({"main": replace(scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING"])})
    fake = FakeCluster(head)
    message = failure_of(fake, run_inputs(timeout_minutes=2, **RELEASE))
    assert "still RUNNING after timeout_minutes=2" in message and fake.node_group.sizes == []
    assert any("the GPU nodes keep running" in line for line in fake.logged)


def test_a_degraded_group_is_refused_before_anything_runs():
    fake = FakeCluster(main_and_tcp_head())
    fake.node_group.desired, fake.node_group.status = 0, "DEGRADED"
    fake.node_group.issues = ("AsgInstanceLaunchFailures: InsufficientInstanceCapacity (eks-gpu-asg)",)
    message = failure_of(fake, run_inputs(**RELEASE))
    assert message.startswith("GPU node group gpu-0a1b2c3 of EKS cluster eks-ray-train is DEGRADED (")
    assert "desiredSize=2 --region us-east-2" in message and "\n" not in message
    assert fake.node_group.sizes == [] and fake.head.probe_submissions == []


def test_a_group_degraded_by_launches_before_its_capacity_block_began_is_waited_for_not_refused():
    """Created at 2 nodes before the block's start, the group's launches failed until then; once the
    block has begun the run waits for the nodes instead of refusing the DEGRADED status."""
    fake = FakeCluster(main_and_tcp_head())
    fake.node_group.status = "DEGRADED"
    fake.node_group.issues = ("AsgInstanceLaunchFailures: the Capacity Block is not active (eks-gpu-asg)",)
    outs = fake.provider().create(props(run_inputs(**RELEASE, not_before="2026-12-05T09:00:25Z"))).outs
    assert outs["status"] == "SUCCEEDED" and fake.node_group.sizes == [0]
    assert any(
        "is DEGRADED from its launches before the Capacity Block began" in line for line in fake.logged
    )
    # The same group with no block to wait for is refused, as any DEGRADED group is.
    refused = FakeCluster(main_and_tcp_head())
    refused.node_group.status = "DEGRADED"
    assert "is DEGRADED (" in failure_of(refused, run_inputs(**RELEASE))
