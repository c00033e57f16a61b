"""Whether the job's `--deadline` leaves room for the run: the fabric gate and one step with its checkpoint.

A job's `--deadline` that leaves no room for them stops the run before anything is scaled or
submitted (`window_problem`): the preview's refusal (`infra.preflight.window`) made again at the
run's own time. Only a run that really happens gets here, so a deadline that passed after a
finished run stops no later `pulumi up`.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from infra.aws_rules.reservation_window import DeadlineCheck, utc_text
from training.config.settings import DEADLINE_FLAG
from workloads.training_run.verdicts import evidence


def job_deadline(job_args: Sequence[str]) -> datetime.datetime | None:
    """The job's `--deadline` (the last one given, as its parser takes it); None without one."""
    found = evidence.flag_value(job_args, DEADLINE_FLAG)
    return datetime.datetime.fromisoformat(found) if found else None


def window_problem(
    job_args: Sequence[str], check: DeadlineCheck | None, now: datetime.datetime, not_before: str | None
) -> str | None:
    """Why the run must not begin: its `--deadline` leaves less than `check.least_s` (the fabric gate
    and one step with its checkpoint, as the preview predicted them) after it begins, now or at a
    Capacity Block's start (`not_before`). The preview's refusal of the same run, made at the run's own
    time, in one line naming the key the deadline comes from and its fix; None when it fits."""
    deadline = job_deadline(job_args)
    if check is None or deadline is None:
        return None
    begins = max(now, datetime.datetime.fromisoformat(not_before)) if not_before else now
    left_s = (deadline - begins).total_seconds()
    if left_s >= check.least_s:
        return None
    left = f"{left_s / 60:.1f} min before" if left_s > 0 else "after"
    return (
        f"config key {check.key!r} = {check.value!r}: the training run begins at {utc_text(begins)}, {left} its "
        f"--deadline {utc_text(deadline)}, and the fabric gate and one step with its checkpoint need "
        f"{check.least_s / 60:.1f} min: not even one checkpointed step fits, so no GPU node was scaled and no job "
        f"submitted; {check.fix}"
    )
