"""The job's `--deadline`, judged again when the run is about to run."""

from __future__ import annotations

from dataclasses import replace

from infra.aws_rules.reservation_window import DeadlineCheck
from tests.harness.training_run_fakes import (
    SMOKE_ARGS,
    FakeCluster,
    failure_of,
    main_and_tcp_head,
    props,
    run_inputs,
)
from workloads.training_run import schema

# --- the deadline, judged again when the run is about to run ----------------------------------------

RELEASE = {"gpu_nodes_after_training": "release", "node_group_name": "gpu-0a1b2c3", "gpu_node_count": 2}

# What the preview hands the run with `training.deadline` (`infra.preflight.window`): the fabric gate
# and one smoke step with its checkpoint, 2 min 30 s.
DEADLINE_CHECK = DeadlineCheck(
    "training.deadline", "2026-12-05T08:00:00Z", "set a later training.deadline, or remove it", 150.0
)


def with_deadline(deadline: str, **changes) -> schema.RunInputs:
    check = replace(DEADLINE_CHECK, value=deadline)
    return run_inputs(job_args=(*SMOKE_ARGS, "--deadline", deadline), deadline_check=check, **changes)


def test_a_run_past_its_deadline_is_refused_in_one_line_before_anything_is_scaled_or_submitted():
    """Only a run that really happens reaches create: its deadline passed an hour before (the fake
    wall clock is at 09:00:00Z), so nothing is scaled out, probed or submitted."""
    fake = FakeCluster(main_and_tcp_head())
    fake.node_group.desired = 0
    message = failure_of(fake, with_deadline("2026-12-05T08:00:00Z", **RELEASE))
    assert message == (
        "config key 'training.deadline' = '2026-12-05T08:00:00Z': the training run begins at 2026-12-05T09:00:00Z, "
        "after its --deadline 2026-12-05T08:00:00Z, and the fabric gate and one step with its checkpoint need "
        "2.5 min: not even one checkpointed step fits, so no GPU node was scaled and no job submitted; set a later "
        "training.deadline, or remove it"
    )
    assert fake.head.submissions == [] and fake.head.probe_submissions == []
    assert fake.node_group.sizes == [] and fake.clock.slept == 0


def test_a_deadline_too_near_for_the_gate_and_a_step_counts_from_a_capacity_blocks_start():
    """Two minutes of room now, one after the block's start: refused either way; with room it runs."""
    near = FakeCluster(main_and_tcp_head())
    message = failure_of(near, with_deadline("2026-12-05T09:02:00Z"))
    assert "begins at 2026-12-05T09:00:00Z, 2.0 min before its --deadline 2026-12-05T09:02:00Z" in message
    later = FakeCluster(main_and_tcp_head())
    message = failure_of(later, with_deadline("2026-12-05T10:05:00Z", not_before="2026-12-05T10:04:00Z"))
    assert "begins at 2026-12-05T10:04:00Z, 1.0 min before its --deadline 2026-12-05T10:05:00Z" in message
    assert later.clock.slept == 0 and later.head.probe_submissions == []
    room = FakeCluster(main_and_tcp_head())
    outs = room.provider().create(props(with_deadline("2026-12-05T09:03:00Z"))).outs
    assert outs["status"] == "SUCCEEDED"
