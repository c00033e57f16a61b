"""The run's log lines: step lines and the summary round-trip, and the parsing modules stay free of torch and Ray."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.harness.paths import REPO_ROOT
from training.metrics import report


def step_metrics(**overrides):
    metrics = {
        "step": 3,
        "steps": 10,
        "loss": 2.5,
        "lr": 3e-3,
        "grad_norm": 0.75,
        "eval_loss": None,
        "eval_perplexity": None,
        "step_time_s": 0.5,
        "tokens_per_s": 4096.0,
        "tokens_per_s_per_gpu": 2048.0,
        "mfu": 0.42,
        "peak_mem_gib": 3.25,
    }
    metrics.update(overrides)
    return metrics


def summary(**overrides):
    values = dict.fromkeys(report.SUMMARY_KEYS, 1)
    values.update(world_size=2, mfu=None, gpu_name=None, run_dir="runs/x", summary_path="runs/x/summary.json")
    values.update(overrides)
    return values


def test_step_line_round_trips():
    line = report.format_step_line(step_metrics())
    assert line.startswith(report.STEP_MARKER + " ")
    assert report.parse_step_line(line) == step_metrics()


def test_step_line_parses_behind_a_ray_worker_prefix():
    line = "\x1b[36m(RayTrainWorker pid=4242, ip=10.0.3.7)\x1b[0m " + report.format_step_line(
        step_metrics(step=7)
    )
    assert report.parse_step_line(line)["step"] == 7


def test_step_line_with_diverged_loss_stays_parseable():
    parsed = report.parse_step_line(report.format_step_line(step_metrics(loss=math.nan, mfu=None)))
    assert parsed["loss"] is None and parsed["mfu"] is None


@pytest.mark.parametrize(
    "line",
    [
        "step 3/10 | loss 2.5000 | 0.500 s/step",
        "TRAIN_STEP {not json",
        'TRAIN_STEP {"step": 3}',
        "",
    ],
)
def test_non_step_lines_parse_to_none(line):
    assert report.parse_step_line(line) is None


def test_step_line_needs_every_key():
    metrics = step_metrics()
    del metrics["mfu"]
    with pytest.raises(KeyError):
        report.format_step_line(metrics)


def test_progress_line_is_human_readable():
    line = report.format_progress_line(step_metrics())
    assert "step  3/10" in line and "loss 2.5000" in line and "MFU 42.0%" in line
    assert "MFU n/a" in report.format_progress_line(step_metrics(mfu=None))


def test_parse_summary_takes_the_last_summary_in_a_log():
    first, last = summary(steps=5), summary(steps=9)
    log = "\n".join(
        [
            "2026-01-01 INFO worker.py -- Started a local Ray instance.",
            report.format_summary(first),
            "(RayTrainWorker pid=1) " + report.format_step_line(step_metrics()),
            '{"transport": "efa", "ok": true}',
            report.format_summary(last),
            "Job 'raysubmit_x' succeeded",
        ]
    )
    assert report.parse_summary(log) == last


def test_parse_summary_without_one_is_none():
    assert report.parse_summary(report.format_step_line(step_metrics()) + "\n{}\nno json here") is None


def test_summary_needs_every_key():
    incomplete = summary()
    del incomplete["loss_last"]
    with pytest.raises(KeyError):
        report.format_summary(incomplete)


def test_log_parsing_modules_import_neither_torch_nor_ray():
    code = (
        "import sys, training, training.metrics.report, training.metrics.flops, training.config.run_config; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


@pytest.mark.slow
def test_torchrun_path_never_imports_ray():
    code = (
        "import sys, training.cli, training.loop, training.launch.torchrun_launcher, training.metrics.artifacts, "
        "training.fabric_probe; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'ray']"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_a_step_line_of_an_older_version_parses_with_its_later_keys_none():
    """A job started by an earlier version (no lr, grad_norm or eval keys) is still followed."""
    from training.metrics.report import format_progress_line, parse_step_line

    line = (
        'TRAIN_STEP {"step":1,"steps":5,"loss":11.93,"step_time_s":4.12,"tokens_per_s":248.5,'
        '"tokens_per_s_per_gpu":31.1,"mfu":0.0005,"peak_mem_gib":9.81}'
    )
    parsed = parse_step_line(line)
    assert parsed is not None and parsed["loss"] == 11.93
    assert parsed["lr"] is None and parsed["grad_norm"] is None and parsed["eval_loss"] is None
    assert "lr n/a" in format_progress_line(parsed)
    assert parse_step_line(line.replace('"mfu":0.0005,', "")) is None
