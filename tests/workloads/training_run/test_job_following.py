"""Following a job to its end: its timeout."""

from __future__ import annotations

from dataclasses import replace

from tests.harness.training_run_fakes import (
    EFA_JOB,
    FakeCluster,
    FakeRayHead,
    failure_of,
    run_inputs,
    scripted,
)


def test_a_job_that_outlives_the_timeout_is_left_running_for_the_next_update():
    head = FakeRayHead({"main": replace(scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING"])})
    fake = FakeCluster(head)
    message = failure_of(fake, run_inputs(timeout_minutes=2))
    assert "still RUNNING after timeout_minutes=2" in message
    assert "the next `pulumi up` waits for it" in message and "ray job stop eks-ray-train-main-" in message
    assert 30 + 120 <= fake.clock.slept <= 30 + 130  # the gate's three polls, then the job's 2 minutes
