"""The fabric probe (`python -m training.fabric_probe`) that the gate runs before each job, and what its numbers say.

The job's tokens/s mixes compute and communication; the probe times the job's collectives alone,
on the same worker group, and reports nccl-tests' bus bandwidth per collective and message size.
At the largest size the rate has levelled off, so that busbw is held against the GPU node's line
rate (DescribeInstanceTypes `NetworkPerformance`, the stack's `line_rate_gbps` input): with
`min_busbw_fraction` set, an EFA run whose busbw falls below that share of the line fails.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROBE_MODULE = "training.fabric_probe"
# The flags of the job that place its worker group, which the probe shares (same names, same meaning).
_SHARED_FLAGS = ("--workers", "--gpus-per-worker", "--cpus-per-worker")
_SHARED_SWITCHES = ("--use-gpu", "--gpu", "--no-use-gpu", "--no-gpu")


def probe_args(job_args: Sequence[str]) -> list[str]:
    """The probe's flags: the job's worker group, one rank per training rank."""
    args: list[str] = []
    for index, arg in enumerate(job_args):
        if arg in _SHARED_SWITCHES or (arg.partition("=")[0] in _SHARED_FLAGS and "=" in arg):
            args.append(arg)
        elif arg in _SHARED_FLAGS and index + 1 < len(job_args):
            args += [arg, job_args[index + 1]]
    return args


def probe_report(lines: Sequence[str]) -> dict[str, Any] | None:
    """The probe's JSON line (`world_size`, `results`), the last one in the driver's log."""
    for line in reversed(lines):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line.strip())
            if isinstance(value, dict) and "results" in value and "world_size" in value:
                return value
    return None


def largest_busbw(report: Mapping[str, Any]) -> dict[str, float]:
    """Each collective's busbw in Gbit/s at the largest message size it was timed at."""
    largest: dict[str, dict] = {}
    for row in report["results"]:
        if row["collective"] not in largest or row["bytes"] > largest[row["collective"]]["bytes"]:
            largest[row["collective"]] = row
    return {collective: round(row["busbw_gbps"], 2) for collective, row in largest.items()}


def busbw_fractions(busbw: Mapping[str, float], line_rate_gbps: float | None) -> dict[str, float] | None:
    """busbw over the line rate, per collective; None without a line rate."""
    if not line_rate_gbps:
        return None
    return {collective: round(rate / line_rate_gbps, 3) for collective, rate in busbw.items()}


def busbw_problems(
    busbw: Mapping[str, float], line_rate_gbps: float | None, min_fraction: float
) -> list[str]:
    """One line per collective whose busbw is under `min_fraction` of the line rate (0: no floor)."""
    fractions = busbw_fractions(busbw, line_rate_gbps)
    if min_fraction <= 0 or fractions is None:
        return []
    return [
        f"{collective}: busbw {busbw[collective]:g} Gbit/s = {fraction:g} of the {line_rate_gbps:g} Gbit/s "
        f"line rate, under minBusbwFraction {min_fraction:g}"
        for collective, fraction in fractions.items()
        if fraction < min_fraction
    ]


@dataclass(frozen=True)
class ProbeResult:
    """The probe run before a job: its submission id and each collective's busbw at the largest size."""

    submission_id: str
    busbw_gbps: dict[str, float]
    largest_bytes: int


def probe_result(submission_id: str, report: Mapping[str, Any]) -> ProbeResult:
    return ProbeResult(submission_id, largest_busbw(report), max(row["bytes"] for row in report["results"]))
