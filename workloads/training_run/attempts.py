"""The job's restarts as its run summary reports them, read for the TrainingRun's outputs and its log.

The summary (`training.metrics.report.RunSummary`) carries `restarts` and `attempts`, one entry per
restart of the worker group from a checkpoint, each with exactly `ATTEMPT_KEYS`. A summary without
them (a job of a training package that does not restart) gives None for both: unknown, not 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.metrics.report import ATTEMPT_KEYS


@dataclass(frozen=True)
class Restarts:
    """`restarts` and `attempts` of a run summary; both None when it reports neither."""

    restarts: int | None
    attempts: list[dict[str, Any]] | None


def restarts_of(summary: Mapping[str, Any]) -> Restarts:
    """The summary's restarts and its attempts, each attempt with `ATTEMPT_KEYS` (a key it lacks as None)."""
    attempts = summary.get("attempts")
    restarts = summary.get("restarts")
    if attempts is None and restarts is None:
        return Restarts(None, None)
    listed = [{key: attempt.get(key) for key in ATTEMPT_KEYS} for attempt in attempts or []]
    return Restarts(restarts if restarts is not None else len(listed), listed)


def attempt_line(job_id: str, attempt: Mapping[str, Any]) -> str:
    """One line of the run's log for one restart."""
    node = f" on {attempt['node']}" if attempt.get("node") else ""
    recovery = attempt.get("recovery_s")
    recovered = (
        f"recovered in {recovery:.1f} s"
        if isinstance(recovery, (int, float))
        else "no step finished after it"
    )
    return (
        f"training run: job {job_id}: restart {attempt.get('attempt')}{node}: {attempt.get('cause')}; "
        f"failed after step {attempt.get('failed_after_step')}, resumed from step {attempt.get('resumed_from_step')}, "
        f"{attempt.get('lost_steps')} steps lost, {recovered}"
    )
