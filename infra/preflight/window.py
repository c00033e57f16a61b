"""The run's window: the deadline it gets, and whether the predicted run fits before it.

The reservation's usable end or `training.deadline`, the earlier, is the job's `--deadline`
(`deadline_of`), and the predicted run is judged against it (`fit_the_window`); the arithmetic is
`infra.aws_rules.reservation_window`'s, the wording this module's."""

from __future__ import annotations

from datetime import datetime, timedelta

import pulumi

from infra.aws_rules.capacity_rules import (
    ReservationFacts,
)
from infra.aws_rules.reservation_window import (
    DEADLINE_KEY,
    RESERVATION_KEY,
    DeadlineCheck,
    Fit,
    JobTimes,
    RunDeadline,
    StartUp,
    WindowFit,
    fit_window,
    least_before_deadline_s,
    run_deadline,
    start_up,
    usable_end,
    utc_text,
)
from infra.config.stack import ConfigError, StackSettings
from infra.config.training_settings import configured_deadline
from infra.planner.planner import StrategyForecast, workload_of
from infra.preflight.errors import PreflightError
from infra.preflight.placement import Placement
from infra.preflight.spans import span
from training.config.deadline_margin import estimated_checkpoint_s, estimated_export_s
from training.config.run_config import TrainConfig


def deadline_of(settings: StackSettings, placement: Placement) -> RunDeadline | None:
    """The run's deadline: the reservation's usable end or `training.deadline`, the earlier."""
    reservation = placement.reservation
    end = usable_end(reservation.reservation_type, reservation.end_date) if reservation else None
    return run_deadline(end, configured_deadline(settings.training))


def _deadline_source(deadline: RunDeadline, reservation: ReservationFacts | None) -> str:
    """Where the deadline comes from, in words."""
    if deadline.key != RESERVATION_KEY or reservation is None or reservation.end_date is None:
        return f"training.deadline {deadline.text}"
    end = utc_text(reservation.end_date)
    if reservation.is_capacity_block:
        return (
            f"Capacity Block {reservation.reservation_id} ends at {end}; EKS scales its node group to 0 at "
            f"{deadline.text}, 40 min before (EC2 terminates its instances from 30 min before)"
        )
    return (
        f"capacity reservation {reservation.reservation_id} ends at {end}; EC2 cancels it within the hour after "
        "and its instances then bill at the On-Demand price"
    )


def _start_up_words(start: StartUp, now: datetime) -> str:
    """`control plane 15 min, the block's start at ..., then GPU nodes 5 min + image pull 10 min + fabric gate 1 min`."""
    nodes = [
        ("GPU nodes", start.gpu_nodes_s),
        ("image pull", start.image_pull_s),
        ("fabric gate", start.gate_s),
    ]
    after = " + ".join(f"{name} {span(seconds)}" for name, seconds in nodes if seconds)
    before = [f"control plane {span(start.control_plane_s)}"] if start.control_plane_s else []
    if start.gpus_from is not None and start.gpus_from > now + timedelta(seconds=start.control_plane_s):
        before.append(f"the block's start at {utc_text(start.gpus_from)}")
    return ", then ".join([", ".join(before), after]) if before else after


def _job_times(config: TrainConfig, predicted: StrategyForecast | None) -> JobTimes:
    """The job's steps at the planner's step time, its checkpoints and export at the training side's estimates."""
    workload = workload_of(config)
    parameters = workload.params if workload else 0
    return JobTimes(
        steps=config.steps,
        step_s=predicted.step_time_s if predicted else None,
        checkpoint_s=estimated_checkpoint_s(parameters),
        checkpoint_every=config.checkpoint_every,
        final_checkpoint=bool(config.checkpoint_every) or config.export_hf,
        evaluates=config.eval_data is not None,
        eval_every=config.eval_every,
        export_s=estimated_export_s(parameters, config.export_dtype) if config.export_hf else 0.0,
    )


def fit_the_window(
    settings: StackSettings,
    placement: Placement,
    deadline: RunDeadline | None,
    config: TrainConfig,
    predicted: StrategyForecast | None,
) -> DeadlineCheck | None:
    """At preview: the predicted run against its deadline. Fits: an info line with the time to
    spare; only some steps fit: a warning (the job stops at its deadline with a checkpoint); not
    even one checkpointed step fits: refused, naming the key the deadline comes from, while the
    stack has no cluster. With a live cluster a warning instead: a training run may have finished
    already, which the preview cannot read, and its unchanged inputs do not run it again. Returns
    the check the training run makes again when it is about to run (`DeadlineCheck`)."""
    if deadline is None:
        return None
    reservation, now = placement.reservation, placement.read_at
    nodes_running = bool(reservation and reservation.own_instances >= settings.gpu_node_count)
    start = start_up(placement.live is not None, nodes_running, placement.gpus_from)
    job = _job_times(config, predicted)
    fit = fit_window(job, start, deadline.at, now)
    check = _deadline_check(settings, deadline, reservation, job)
    source = _deadline_source(deadline, reservation)
    begins = f"start-up {_start_up_words(start, now)}: the job starts about {utc_text(fit.job_starts)}"
    steps = f"{job.steps} steps x {job.step_s:.2f} s" if job.step_s is not None else f"{job.steps} steps"
    checkpoints = (
        f"{fit.checkpoints} checkpoint(s) of an estimated {span(job.checkpoint_s)}"
        if fit.checkpoints
        else "no checkpoint"
    )
    if fit.outcome is Fit.REFUSED:
        _refuse_the_window(check, placement, source, begins, fit)
    elif fit.outcome is Fit.UNPREDICTED:
        pulumi.log.info(
            f"run window: {source}. The job gets --deadline {deadline.text} and stops before it with a "
            f"checkpoint; with no step time from the planner for {settings.gpu_node_type}, its {steps} are not "
            f"predicted ({begins})"
        )
    elif fit.outcome is Fit.PARTIAL:
        pulumi.log.warn(
            f"run window: {source}. Predicted: {begins}; only {fit.steps} of the {job.steps} configured steps "
            f"fit before --deadline {deadline.text} ({steps}; {checkpoints}): the job stops at its deadline with a "
            f"checkpoint of step {fit.steps}; lower training.steps to {fit.steps}, or give the run a later window"
        )
    elif fit.outcome is Fit.FITS:
        assert fit.spare_s is not None and fit.run_s is not None
        pulumi.log.info(
            f"run window: {source}. Predicted: {begins}; {steps} with {checkpoints} take {span(fit.run_s)}: "
            f"the run fits before --deadline {deadline.text} with {span(fit.spare_s)} to spare"
        )
    return check


def _deadline_check(
    settings: StackSettings, deadline: RunDeadline, reservation: ReservationFacts | None, job: JobTimes
) -> DeadlineCheck:
    """The key the deadline comes from, its value and its fix, and what a run needs before it."""
    least = least_before_deadline_s(job)
    if deadline.key != RESERVATION_KEY or reservation is None:
        return DeadlineCheck(
            DEADLINE_KEY, deadline.text, "set a later training.deadline, or remove it", least
        )
    reservation_id = reservation.reservation_id
    if reservation.is_capacity_block:
        fix = (
            "extend the block (`aws ec2 describe-capacity-block-extension-offerings --capacity-reservation-id "
            f"{reservation_id} --capacity-block-extension-duration-hours 24 --region {settings.region}` lists the "
            "offers), set capacityReservationId to a later block, or remove it to run On-Demand"
        )
    else:
        fix = (
            f"move its end date (`aws ec2 modify-capacity-reservation --capacity-reservation-id {reservation_id} "
            f"--end-date-type limited --end-date <later> --region {settings.region}`), or remove capacityReservationId"
        )
    return DeadlineCheck(RESERVATION_KEY, reservation_id, fix, least)


def _refuse_the_window(
    check: DeadlineCheck, placement: Placement, source: str, begins: str, fit: WindowFit
) -> None:
    """Not even one checkpointed step fits: refused without a cluster, warned about with one."""
    one = f"{span(fit.run_s)} for one step with its checkpoint" if fit.run_s is not None else "a checkpoint"
    left = f"{span(fit.available_s)} before the deadline" if fit.available_s > 0 else "after the deadline"
    window = f"{source}. Predicted: {begins}, {left}, and it needs {one}: not even one checkpointed step fits"
    if placement.live is None:
        error = ConfigError if check.key == DEADLINE_KEY else PreflightError
        raise error(f"config key {check.key!r} = {check.value!r}: {window}; {check.fix}")
    pulumi.log.warn(
        f"run window: {window}. The cluster exists and the preview cannot read whether its training run has "
        "finished: a run whose inputs are unchanged does not run again, and one that runs is refused when it "
        f"starts, before any GPU node is scaled or job submitted. To run the job again, {check.fix}"
    )
