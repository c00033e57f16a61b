"""`python -m training`: parse flags, pick the launcher, print the summary last."""

from __future__ import annotations

import sys

from training.config import parse_args
from training.report import format_summary


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.launcher == "torchrun":
        from training.torchrun_launcher import run as run_torchrun

        run_torchrun(config)
        return 0

    from training.ray_launcher import RunFailedError, UsageError, run

    try:
        summary = run(config)
    except UsageError as error:
        print(f"python -m training: error: {error}", file=sys.stderr)
        return 2
    except RunFailedError as error:
        print(f"training failed: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary), flush=True)
    return 0
