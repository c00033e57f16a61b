"""The run's configuration (training/config/run_config.py): the defaults, flags over presets, and bad
arguments in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.paths import REPO_ROOT
from training.config.run_config import (
    PACKAGE_DIR,
    SHIPPED_CORPUS,
    parse_args,
)


def test_default_is_the_tiny_cpu_job_on_the_shipped_corpus():
    config = parse_args([])
    assert (config.preset, config.workers, config.use_gpu, config.launcher) == ("tiny", 2, False, "ray")
    assert Path(config.data) == SHIPPED_CORPUS and Path(config.storage_path).is_absolute()


def test_flags_override_the_preset():
    config = parse_args(
        ["--preset", "throughput", "--steps", "12", "--no-compile", "--hsdp-replicas", "2", "--workers", "8"]
    )
    assert (config.steps, config.compile, config.hsdp_replicas, config.seq_len) == (12, False, 2, 4096)
    assert parse_args(["--preset", "throughput", "--hsdp-replicas", "auto"]).hsdp_replicas == 0


def test_gpu_flags_take_both_spellings():
    assert not parse_args(["--preset", "smoke", "--no-gpu"]).use_gpu
    assert not parse_args(["--preset", "smoke", "--no-use-gpu"]).use_gpu
    assert parse_args(["--use-gpu"]).use_gpu and parse_args(["--preset", "smoke"]).use_gpu


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--preset", "huge"],
        ["--data", "/no/such/corpus"],
        ["--launcher", "torchrun", "--local"],
        ["--workers", "6", "--hsdp-replicas", "4"],
        ["--hsdp-replicas", "two"],
        ["--seq-len", "100000"],
        ["--model-config", "no-such-model"],
        ["--max-failures", "-2"],
        ["--grad-accum-steps", "0"],
        ["--unknown-flag"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_reports_bad_arguments_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "training", "--steps", "-1"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "usage:" in result.stderr and "Traceback" not in result.stderr


def test_package_fits_a_configmap():
    """Everything under training/ ships in a ConfigMap (1 MiB); only small text files."""
    files = [path for path in PACKAGE_DIR.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert {path.suffix for path in files} <= {".py", ".json", ".jsonl", ".txt", ".md"}
    assert sum(path.stat().st_size for path in files) < 512 * 1024
    assert sum(path.stat().st_size for path in SHIPPED_CORPUS.iterdir()) < 200 * 1024
