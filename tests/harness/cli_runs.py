"""`python -m training` run as a user runs it, in a subprocess from the repository root, and the
lines it prints read back: the harness of the tests that train end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.harness.paths import REPO_ROOT
from training.metrics.artifacts import closing_line
from training.metrics.report import parse_step_line, parse_summary

RUN_TIMEOUT_S = 300


def run_cli(
    *args: str, launcher: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """One intra-op thread per process, as Ray gives each worker (tests/conftest.py says why)."""
    command = [*(launcher or [sys.executable]), "-m", "training", *args]
    return subprocess.run(
        command,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**(env or os.environ), "OMP_NUM_THREADS": "1"},
    )


def step_lines(stdout: str) -> list[dict]:
    return [parsed for parsed in map(parse_step_line, stdout.splitlines()) if parsed is not None]


def printed_summary(stdout: str) -> dict:
    """The run's JSON summary, as log parsers find it (`parse_summary`); it is the line before the
    last, which is the closing line for people (`training.metrics.artifacts.closing_line`)."""
    lines = stdout.strip().splitlines()
    summary = json.loads(lines[-2])
    assert parse_summary(stdout) == summary, lines[-2:]
    assert lines[-1] == closing_line(summary), lines[-1]
    return summary
