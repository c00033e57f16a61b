"""`python -m training`: parse flags, pick the launcher, print the JSON summary, then its line for people.

Expected failures (no cluster, no GPU, a model that cannot be fetched, a corpus too
small) end in one line naming the fix and exit status 2; a run that fails after its
retries exits 1. A torchrun rank ends through `training.distributed.rank_exit`.
"""

from __future__ import annotations

import sys
import time

from training.config.run_config import TrainConfig, parse_args
from training.errors import RunFailedError, UsageError
from training.launch.launch_checks import check_model_files, check_packages, check_worker_group
from training.metrics.artifacts import closing_line
from training.metrics.report import format_summary

PROGRAM = "python -m training"


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    exit_code = _run(config)
    if config.launcher == "torchrun":
        from training.distributed.rank_exit import end_rank_process

        end_rank_process(exit_code)  # a torchrun rank ends here (the module says why)
    return exit_code


def _run(config: TrainConfig) -> int:
    try:
        if config.deadline is not None:
            # A deadline already past ends here, before Ray starts; one too near to checkpoint the
            # model ends when the loop knows the model's size (`Deadline.check_start`).
            from training.components.deadline import refusal

            if problem := refusal(config.deadline, time.time(), checkpoint_s=0.0):
                raise UsageError(problem)
        if config.launcher == "ray":
            check_worker_group(config)
        check_model_files(config)
        check_packages(config)
        if config.launcher == "torchrun":
            from training.launch.torchrun_launcher import run as run_torchrun

            run_torchrun(config)
            return 0

        from training.launch.ray_launcher import run

        summary = run(config)
    except UsageError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except RunFailedError as error:
        print(f"training failed: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary), flush=True)
    print(closing_line(summary), flush=True)
    return 0
