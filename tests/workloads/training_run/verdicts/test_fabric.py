"""The fabric probe of the gate: its flags from the job's, its JSON line, busbw against the line rate."""

from __future__ import annotations

from tests.harness.training_run_fakes import driver_log
from workloads.training_run.verdicts.fabric import (
    JUDGED_COLLECTIVES,
    busbw_fractions,
    busbw_problems,
    busbw_reading,
    largest_busbw,
    probe_args,
    probe_report,
)


def test_the_probe_takes_the_jobs_worker_group_flags_only():
    job = ["--preset", "smoke", "--workers", "8", "--use-gpu", "--gpus-per-worker=1", "--steps", "5"]
    assert probe_args(job) == ["--workers", "8", "--use-gpu", "--gpus-per-worker=1"]


def test_busbw_at_the_largest_size_of_each_collective():
    report = probe_report(driver_log("driver_probe.log").splitlines())
    assert report is not None and report["world_size"] == 8
    assert largest_busbw(report) == {"all_reduce": 33.6, "all_gather": 35.2, "reduce_scatter": 34.9}
    assert probe_report(driver_log("driver_main.log").splitlines()) is None  # a summary is no probe line


JUDGED_NOTE = "the floor is judged on all_gather and reduce_scatter only"
TREE = "on two nodes NCCL's tree all_reduce can go beyond the line rate"

# NVIDIA/nccl-tests issue 22: two nodes on 100 Gbit/s EFA, 1 GB all_reduce_perf. With NCCL's default
# (tree on two nodes) busbw 125 Gbit/s, above the line; with the ring forced (NCCL_TREE_THRESHOLD=0)
# 60 Gbit/s. The issue timed no all_gather or reduce_scatter: they run on the ring, so they stand
# here at the ring's 60 Gbit/s on that fabric.
ISSUE_22_LINE_GBPS = 100.0
ISSUE_22 = {"all_reduce": 125.0, "all_gather": 60.0, "reduce_scatter": 60.0}


def test_the_floor_is_judged_on_the_ring_collectives_only():
    assert JUDGED_COLLECTIVES == ("all_gather", "reduce_scatter")


def test_all_reduce_over_the_line_rate_on_two_nodes_does_not_hide_slow_ring_collectives():
    """Issue 22's two nodes: all_reduce at 1.25 of the line, the ring collectives at 0.6 fail 0.8."""
    assert busbw_fractions(ISSUE_22, ISSUE_22_LINE_GBPS) == {
        "all_reduce": 1.25,
        "all_gather": 0.6,
        "reduce_scatter": 0.6,
    }
    assert busbw_problems(ISSUE_22, ISSUE_22_LINE_GBPS, 0.8) == [
        "all_gather: busbw 60 Gbit/s = 0.6 of the 100 Gbit/s line rate, under minBusbwFraction 0.8",
        "reduce_scatter: busbw 60 Gbit/s = 0.6 of the 100 Gbit/s line rate, under minBusbwFraction 0.8",
        f"{JUDGED_NOTE} (all_reduce's 1.25 of the line rate is reported, not judged: {TREE})",
    ]
    # A floor under the ring collectives' share passes, whatever all_reduce's.
    assert busbw_problems(ISSUE_22, ISSUE_22_LINE_GBPS, 0.55) == []


def test_p4d_all_reduce_over_the_line_rate_is_reported_not_failed():
    """docs/benchmarks.md (NVIDIA/nccl issue 527): two p4d at busbw 57.17 GB/s on a 50 GB/s line."""
    fractions = busbw_fractions({"all_reduce": 57.17 * 8}, 400.0)
    assert fractions == {"all_reduce": 1.143}


def test_all_reduce_under_the_floor_passes_when_the_ring_collectives_clear_it():
    """tests/fixtures/training_run/driver_probe.log (rates constructed in the probe's format, not
    measured, near the g6.12xlarge's 40 Gbit/s line): all_reduce 0.84, all_gather 0.88 and
    reduce_scatter 0.8725 of the line, against a floor of 0.85."""
    report = probe_report(driver_log("driver_probe.log").splitlines())
    assert report is not None
    busbw = largest_busbw(report)
    assert busbw_fractions(busbw, 40.0) == {"all_reduce": 0.84, "all_gather": 0.88, "reduce_scatter": 0.872}
    assert busbw_problems(busbw, 40.0, 0.85) == []
    assert busbw_problems(busbw, 40.0, 0.875) == [
        "reduce_scatter: busbw 34.9 Gbit/s = 0.872 of the 40 Gbit/s line rate, under minBusbwFraction 0.875",
        f"{JUDGED_NOTE} (all_reduce's 0.84 of the line rate is reported, not judged: {TREE})",
    ]


def test_a_judged_collective_missing_from_the_report_fails_saying_so():
    assert busbw_problems({"all_reduce": 38.0, "all_gather": 39.0}, 40.0, 0.9) == [
        "reduce_scatter: not in the probe's report, so its busbw could not be held against minBusbwFraction 0.9",
        f"{JUDGED_NOTE} (all_reduce's 0.95 of the line rate is reported, not judged: {TREE})",
    ]
    assert busbw_problems({}, 40.0, 0.9) == [
        "all_gather: not in the probe's report, so its busbw could not be held against minBusbwFraction 0.9",
        "reduce_scatter: not in the probe's report, so its busbw could not be held against minBusbwFraction 0.9",
        f"{JUDGED_NOTE} ({TREE})",
    ]


def test_no_floor_without_a_fraction_or_a_line_rate():
    assert busbw_problems(ISSUE_22, ISSUE_22_LINE_GBPS, 0) == []
    assert busbw_problems(ISSUE_22, None, 0.8) == [] and busbw_fractions(ISSUE_22, None) is None
    assert busbw_problems({}, None, 0.8) == []


def test_the_gates_log_reads_each_share_and_names_the_judged_collectives():
    assert busbw_reading(ISSUE_22, ISSUE_22_LINE_GBPS) == (
        "all_reduce 125 Gbit/s = 1.25, all_gather 60 Gbit/s = 0.6, reduce_scatter 60 Gbit/s = 0.6 of the "
        f"100 Gbit/s line rate; minBusbwFraction is judged on all_gather and reduce_scatter only ({TREE})"
    )
    assert (
        busbw_reading({"all_gather": 35.2}, None)
        == "all_gather 35.2 Gbit/s; no line rate, so no floor is judged"
    )
