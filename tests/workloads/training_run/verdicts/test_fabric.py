"""The fabric probe of the gate: its flags from the job's, its JSON line, busbw against the line rate."""

from __future__ import annotations

from tests.harness.training_run_fakes import driver_log
from workloads.training_run.verdicts.fabric import busbw_problems, largest_busbw, probe_args, probe_report


def test_the_probe_takes_the_jobs_worker_group_flags_only():
    job = ["--preset", "smoke", "--workers", "8", "--use-gpu", "--gpus-per-worker=1", "--steps", "5"]
    assert probe_args(job) == ["--workers", "8", "--use-gpu", "--gpus-per-worker=1"]


def test_busbw_at_the_largest_size_of_each_collective():
    report = probe_report(driver_log("driver_probe.log").splitlines())
    assert report is not None and report["world_size"] == 8
    assert largest_busbw(report) == {"all_reduce": 33.6, "all_gather": 35.2, "reduce_scatter": 34.9}
    assert probe_report(driver_log("driver_main.log").splitlines()) is None  # a summary is no probe line


def test_a_floor_fails_only_the_collectives_under_it():
    busbw = {"all_reduce": 33.6, "all_gather": 35.2}
    assert busbw_problems(busbw, 40.0, 0.85) == [
        "all_reduce: busbw 33.6 Gbit/s = 0.84 of the 40 Gbit/s line rate, under minBusbwFraction 0.85"
    ]
    assert busbw_problems(busbw, 40.0, 0) == [] and busbw_problems(busbw, None, 0.85) == []
