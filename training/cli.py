"""`python -m training`: parse flags, pick the launcher, print the summary last.

Expected failures (no cluster, no GPU, a model that cannot be fetched, a corpus too
small) end in one line naming the fix and exit status 2; a run that fails after its
retries exits 1.
"""

from __future__ import annotations

import sys

from training.config import parse_args
from training.errors import RunFailedError, UsageError
from training.preflight import check_model_files, check_packages
from training.report import format_summary

PROGRAM = "python -m training"


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        check_model_files(config)
        check_packages(config)
        if config.launcher == "torchrun":
            from training.torchrun_launcher import run as run_torchrun

            run_torchrun(config)
            return 0

        from training.ray_launcher import run

        summary = run(config)
    except UsageError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except RunFailedError as error:
        print(f"training failed: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary), flush=True)
    return 0
