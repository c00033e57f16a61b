"""The window arithmetic: usable ends, the run's deadline, the start-up, and the fit of the steps,
with round numbers so every expectation is worked out by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from infra.aws_rules.reservation_window import (
    CONTROL_PLANE_S,
    DEADLINE_KEY,
    FABRIC_GATE_S,
    GPU_NODES_READY_S,
    IMAGE_PULL_S,
    RESERVATION_KEY,
    Fit,
    JobTimes,
    StartUp,
    fit_window,
    least_before_deadline_s,
    parse_aws_time,
    run_deadline,
    start_up,
    steps_that_fit,
    usable_end,
    utc_text,
)
from training.config.deadline_margin import WIND_DOWN_S

NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
END = datetime(2026, 12, 5, 11, 30, tzinfo=UTC)
# No start-up: the job's first step is at NOW.
AT_ONCE = StartUp(control_plane_s=0.0, gpu_nodes_s=0.0, image_pull_s=0.0, gate_s=0.0)


def test_aws_dates_read_with_or_without_milliseconds_and_print_in_utc():
    assert parse_aws_time("2026-12-05T11:30:00Z") == END
    assert parse_aws_time("2026-12-05T11:30:00.000Z") == END
    assert parse_aws_time("2026-12-05T12:30:00+01:00") == END
    assert utc_text(parse_aws_time("2026-12-05T12:30:00+01:00")) == "2026-12-05T11:30:00Z"


def test_a_capacity_block_is_usable_until_40_minutes_before_its_end_an_odcr_until_its_end():
    assert usable_end("capacity-block", END) == datetime(2026, 12, 5, 10, 50, tzinfo=UTC)
    assert usable_end("default", END) == END
    assert usable_end(None, END) == END
    assert usable_end("default", None) is None


def test_the_deadline_is_the_earlier_of_the_reservation_and_training_deadline():
    earlier = END - timedelta(hours=1)
    assert run_deadline(END, earlier) == run_deadline(None, earlier)
    assert run_deadline(END, earlier).key == DEADLINE_KEY  # type: ignore[union-attr]
    assert run_deadline(earlier, END).at == earlier  # type: ignore[union-attr]
    assert run_deadline(earlier, END).key == RESERVATION_KEY  # type: ignore[union-attr]
    assert run_deadline(END, END).key == RESERVATION_KEY  # type: ignore[union-attr]
    assert run_deadline(None, None) is None


def test_start_up_leaves_out_what_is_already_there():
    fresh = start_up(cluster_exists=False, gpu_nodes_running=False)
    assert fresh.job_starts(NOW) == NOW + timedelta(
        seconds=CONTROL_PLANE_S + GPU_NODES_READY_S + IMAGE_PULL_S + FABRIC_GATE_S
    )
    running = start_up(cluster_exists=True, gpu_nodes_running=True)
    assert running.job_starts(NOW) == NOW + timedelta(seconds=FABRIC_GATE_S)  # every job has its gate


def test_gpu_nodes_launch_at_a_blocks_start_or_once_the_control_plane_exists_whichever_is_later():
    later = NOW + timedelta(hours=1)
    waits = start_up(cluster_exists=False, gpu_nodes_running=False, gpus_from=later)
    after_the_nodes = GPU_NODES_READY_S + IMAGE_PULL_S + FABRIC_GATE_S
    assert waits.job_starts(NOW) == later + timedelta(seconds=after_the_nodes)
    soon = start_up(cluster_exists=False, gpu_nodes_running=False, gpus_from=NOW + timedelta(minutes=5))
    assert soon.job_starts(NOW) == NOW + timedelta(seconds=CONTROL_PLANE_S + after_the_nodes)


def test_steps_checkpoints_and_evaluations_add_up():
    job = JobTimes(
        steps=100, step_s=10.0, checkpoint_s=60.0, checkpoint_every=10, evaluates=True, eval_every=4
    )
    # 20 steps: checkpoints at 10 and 20; evaluations at 4, 8, 10, 12, 16, 20 (every 4th and at each checkpoint).
    assert job.through(20, 10.0) == 20 * 10 + 2 * 60 + 6 * 10
    # Ending after step 20: steps 1-19 (1 checkpoint, 5 evaluations), step 20 with its evaluation and
    # checkpoint, and the wind-down.
    assert job.ending_after(20, 10.0, checkpoint=True) == 19 * 10 + 60 + 5 * 10 + (10 + 10 + 60) + WIND_DOWN_S
    assert job.checkpoints(20, checkpoint=True) == 2


def test_the_steps_that_fit_follow_the_jobs_own_rule():
    """Step k + 1 runs while the time after step k plus the job's margin (a checkpoint, two steps,
    the wind-down) stays within the window: 100 s steps, a 50 s checkpoint, margin 280 s."""
    job = JobTimes(steps=1000, step_s=100.0, checkpoint_s=50.0)
    assert job.margin_s(100.0) == 50 + 2 * 100 + WIND_DOWN_S
    # through(k) + 280 <= 1000 holds for k <= 7: steps 1..8 run.
    assert steps_that_fit(job, 100.0, 1000.0) == 8
    assert steps_that_fit(job, 100.0, 979.0) == 7
    assert steps_that_fit(job, 100.0, 1.0) == 1  # the first always runs: judging it is the refusal's job


def test_a_run_that_fits_says_what_it_has_to_spare():
    job = JobTimes(steps=10, step_s=100.0, checkpoint_s=50.0, checkpoint_every=5, final_checkpoint=True)
    fit = fit_window(job, AT_ONCE, NOW + timedelta(hours=1), NOW)
    assert fit.outcome is Fit.FITS and fit.steps == 10 and fit.checkpoints == 2
    assert fit.run_s == 10 * 100 + 2 * 50 + WIND_DOWN_S
    assert fit.spare_s == 3600 - fit.run_s


def test_a_run_longer_than_its_window_is_told_how_many_steps_fit():
    job = JobTimes(steps=1000, step_s=100.0, checkpoint_s=50.0)
    fit = fit_window(job, AT_ONCE, NOW + timedelta(seconds=1000), NOW)
    assert (fit.outcome, fit.steps, fit.checkpoints) == (Fit.PARTIAL, 8, 1)
    assert fit.run_s == 8 * 100 + 50 + WIND_DOWN_S  # within the window: stopped with its checkpoint


def test_a_window_without_room_for_one_checkpointed_step_is_refused():
    job = JobTimes(steps=1000, step_s=100.0, checkpoint_s=50.0)
    one = 100 + 50 + WIND_DOWN_S
    assert fit_window(job, AT_ONCE, NOW + timedelta(seconds=one), NOW).outcome is Fit.PARTIAL
    refused = fit_window(job, AT_ONCE, NOW + timedelta(seconds=one - 1), NOW)
    assert (refused.outcome, refused.run_s) == (Fit.REFUSED, one)
    # A start-up that ends past the deadline leaves a negative window.
    late = fit_window(job, StartUp(0.0, 0.0, 0.0, gate_s=600.0), NOW + timedelta(minutes=5), NOW)
    assert late.outcome is Fit.REFUSED and late.available_s == -300


def test_what_a_run_needs_before_its_deadline_is_the_gate_and_one_checkpointed_step():
    """The training run's own check when it is about to run: the fabric gate, then the refused
    window's one step with its checkpoint (or, without a step time, the job's own floor)."""
    job = JobTimes(steps=1000, step_s=100.0, checkpoint_s=50.0, evaluates=True)
    assert job.least_s() == 100 + 100 + 50 + WIND_DOWN_S  # the step, its evaluation, its checkpoint
    assert least_before_deadline_s(job) == FABRIC_GATE_S + job.least_s()
    unpredicted = JobTimes(steps=10, step_s=None, checkpoint_s=40.0)
    assert least_before_deadline_s(unpredicted) == FABRIC_GATE_S + 40 + WIND_DOWN_S


@pytest.mark.parametrize(("window_s", "outcome"), [(31.0, Fit.UNPREDICTED), (30.0, Fit.REFUSED)])
def test_without_a_step_time_only_the_jobs_own_start_refusal_is_predicted(window_s, outcome):
    """The job refuses to start when its deadline is within a checkpoint and its wind-down."""
    job = JobTimes(steps=10, step_s=None, checkpoint_s=0.0)
    assert fit_window(job, AT_ONCE, NOW + timedelta(seconds=window_s), NOW).outcome is outcome
