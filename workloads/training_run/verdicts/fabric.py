"""The fabric probe (`python -m training.fabric_probe`) that the gate runs before each job, and what its numbers say.

The job's tokens/s mixes compute and communication; the probe times the job's collectives alone,
on the same worker group, and reports nccl-tests' bus bandwidth per collective and message size.
At the largest size the rate has levelled off, so that busbw is held against the GPU node's line
rate (DescribeInstanceTypes `NetworkPerformance`, the stack's `line_rate_gbps` input): with
`min_busbw_fraction` set, an EFA run whose all_gather or reduce_scatter busbw falls below that
share of the line fails (`JUDGED_COLLECTIVES`: all_reduce's busbw is reported, never judged, since
on two nodes NCCL's tree all_reduce can go beyond the line rate).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.config.settings import switch_values

PROBE_MODULE = "training.fabric_probe"
# The flags of the job that place its worker group, which the probe shares (same names, same meaning).
_SHARED_FLAGS = ("--workers", "--gpus-per-worker", "--cpus-per-worker")
_SHARED_SWITCHES = tuple(switch_values("use_gpu"))


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


# The collectives whose busbw the floor is judged on: those NCCL runs on a ring, whose busbw is
# bounded by the slowest link's rate. all_reduce is not one: on two nodes NCCL runs it with its
# tree (or NVLS tree) algorithm, which sends less over the network than nccl-tests' ring factor
# 2(n-1)/n assumes, so its busbw can go beyond the NIC's line rate. NCCL's maintainer (sjeaugey,
# NVIDIA/nccl-tests issue 196): "On two nodes, NCCL uses the tree (or nvlstree) algorithm which can
# indeed go beyond the network bottleneck ... force NCCL_ALGO=RING" to measure the network;
# NVIDIA/nccl-tests issue 22: all_reduce busbw 125 Gbit/s on 100 Gbit/s EFA with 2 nodes, 60 Gbit/s
# once the ring was forced; docs/benchmarks.md: p4d's 2-node all_reduce at busbw 57.17 GB/s on a
# 50 GB/s line (NVIDIA/nccl issue 527). A floor judged on all_reduce would pass a slow network.
JUDGED_COLLECTIVES = ("all_gather", "reduce_scatter")
JUDGED = " and ".join(JUDGED_COLLECTIVES)
UNJUDGED_WHY = "on two nodes NCCL's tree all_reduce can go beyond the line rate"


def busbw_fractions(busbw: Mapping[str, float], line_rate_gbps: float | None) -> dict[str, float] | None:
    """busbw over the line rate, per collective, all_reduce's too (above 1 on two nodes is no
    error: see `JUDGED_COLLECTIVES`); None without a line rate."""
    if not line_rate_gbps:
        return None
    return {collective: round(rate / line_rate_gbps, 3) for collective, rate in busbw.items()}


def busbw_reading(busbw: Mapping[str, float], line_rate_gbps: float | None) -> str:
    """The probe's busbw as the gate's log reads it: each collective's Gbit/s, its share of the
    line rate, and which collectives a floor is judged on (set or not: the log says what the
    numbers mean, `busbw_problems` whether they fail)."""
    fractions = busbw_fractions(busbw, line_rate_gbps)
    if fractions is None:
        rates = ", ".join(f"{collective} {rate:g} Gbit/s" for collective, rate in busbw.items())
        return f"{rates}; no line rate, so no floor is judged"
    rates = ", ".join(
        f"{collective} {rate:g} Gbit/s = {fractions[collective]:g}" for collective, rate in busbw.items()
    )
    line = f"{line_rate_gbps:g} Gbit/s line rate"
    return f"{rates} of the {line}; minBusbwFraction is judged on {JUDGED} only ({UNJUDGED_WHY})"


def busbw_problems(
    busbw: Mapping[str, float], line_rate_gbps: float | None, min_fraction: float
) -> list[str]:
    """What keeps the probe's busbw from clearing `min_fraction` of the line rate, one line each:
    each of `JUDGED_COLLECTIVES` under it or missing from the report, then one line naming the
    collectives judged and the share of those that were not; [] when they clear it, when
    `min_fraction` is 0 (no floor), or without a line rate (nothing to hold busbw against, as
    `busbw_reading` says in the gate's log)."""
    fractions = busbw_fractions(busbw, line_rate_gbps)
    if min_fraction <= 0 or fractions is None:
        return []
    problems = []
    for collective in JUDGED_COLLECTIVES:
        if collective not in fractions:
            problems.append(
                f"{collective}: not in the probe's report, so its busbw could not be held against "
                f"minBusbwFraction {min_fraction:g}"
            )
        elif fractions[collective] < min_fraction:
            problems.append(
                f"{collective}: busbw {busbw[collective]:g} Gbit/s = {fractions[collective]:g} of the "
                f"{line_rate_gbps:g} Gbit/s line rate, under minBusbwFraction {min_fraction:g}"
            )
    if not problems:
        return []
    unjudged = ", ".join(
        f"{collective}'s {fraction:g} of the line rate"
        for collective, fraction in fractions.items()
        if collective not in JUDGED_COLLECTIVES
    )
    reported = f" ({unjudged} is reported, not judged: {UNJUDGED_WHY})" if unjudged else f" ({UNJUDGED_WHY})"
    return [*problems, f"the floor is judged on {JUDGED} only{reported}"]


def least_bytes_into_each_node(report: Mapping[str, Any], nodes: int) -> int | None:
    """The bytes each of `nodes` nodes must have received over the network during the probe, whatever
    algorithm NCCL chose: of each all_gather, reduce_scatter or all_reduce of a message of S bytes,
    a node holds at most its own 1/`nodes` share before the call and must end with data that depends
    on every other node's share (all_gather: their parts; reduce_scatter and all_reduce: their
    contributions to its part, reduced at best before they leave their node), so at least
    (nodes - 1)/nodes x S arrive. Summed over every call the report says the probe made (`iters`
    timed ones after `warmup_iters`, per collective and size); None for a report that does not say."""
    iters, warmup = report.get("iters"), report.get("warmup_iters")
    if not isinstance(iters, int) or not isinstance(warmup, int) or nodes < 1:
        return None
    calls = iters + warmup
    return sum((nodes - 1) * row["bytes"] * calls // nodes for row in report["results"])


@dataclass(frozen=True)
class ProbeResult:
    """The probe run before a job: its submission id, each collective's busbw at the largest size,
    and the bytes each node must have received during it (`least_bytes_into_each_node`; None:
    the report does not say how many calls it made)."""

    submission_id: str
    busbw_gbps: dict[str, float]
    largest_bytes: int
    least_node_bytes: int | None = None


def probe_result(submission_id: str, report: Mapping[str, Any], nodes: int) -> ProbeResult:
    return ProbeResult(
        submission_id,
        largest_busbw(report),
        max(row["bytes"] for row in report["results"]),
        least_bytes_into_each_node(report, nodes),
    )
