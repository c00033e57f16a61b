"""`python -m training` as a person meets it: --help, bad values, and the expected failures
(no cluster, no GPU, no access to the Hugging Face Hub) as one line without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import PRESETS, build_parser, parse_args

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120


def run_training(*args: str, env: dict[str, str] | None = None, launcher: list[str] | None = None):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [*(launcher or [sys.executable]), "-m", "training", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment,
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The run failed with exit 2 and exactly one line on stderr (no traceback, no usage)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("python -m training: error: ")
    return lines[0]


def help_of(flag: str) -> str:
    action = next(action for action in build_parser()._actions if flag in action.option_strings)
    return action.help or ""


def test_help_shows_each_flags_effective_default_not_none():
    text = build_parser().format_help()
    assert "(default: None)" not in text
    assert "default: 128; --preset throughput: 4096" in help_of("--seq-len")
    assert "default: 30; --preset smoke: 5; --preset throughput: 50" in help_of("--steps")
    assert "default: training/corpus; --preset smoke: synthetic" in help_of("--data")
    assert "default: 2; --preset smoke: one per GPU of the cluster" in help_of("--workers")
    assert "(default: runs)" in help_of("--storage-path")
    # Every setting a preset sets states its default.
    for action in build_parser()._actions:
        if action.dest in PRESETS["tiny"]:
            assert "(default: " in (action.help or ""), action.dest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seq-len", "abc"], "argument --seq-len: expected a whole number >= 1, got 'abc'"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--lr", "fast"], "argument --lr/--learning-rate: expected a number > 0, got 'fast'"),
        (["--seed", "x"], "argument --seed: expected a whole number, got 'x'"),
        (["--hsdp-replicas", "two"], "argument --hsdp-replicas: expected 'auto' or a count >= 1, got 'two'"),
    ],
)
def test_a_bad_value_names_the_flag_and_what_it_expects(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    error = capsys.readouterr().err
    assert message in error and "invalid" not in error


def ray_cluster_running() -> bool:
    """Ray's address "auto" also joins any Ray found running on this machine (its GCS process)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"gcs_server" in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
def test_no_ray_cluster_is_one_line_that_suggests_local():
    if ray_cluster_running():
        pytest.skip("a Ray cluster runs on this machine; `auto` would join it")
    line = one_line_error(run_training("--steps", "1"))
    assert "no running Ray cluster found" in line and "--local" in line


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_a_model_the_hub_cannot_deliver_is_one_line(launcher, tmp_path):
    """HF_HUB_OFFLINE with an empty cache: huggingface_hub's documented offline mode, the
    situation of a machine without access to the Hub."""
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    args = ["--preset", "smoke", "--no-gpu", "--workers", "1", "--steps", "1"]
    if launcher == "ray":
        result = run_training("--local", *args, env=offline)
    else:  # one rank, as torchrun would start it
        rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        result = run_training("--launcher", "torchrun", *args, env={**offline, **rank})
    line = one_line_error(result)
    assert "--model-id Qwen/Qwen2.5-1.5B" in line and "--init random" in line


@pytest.mark.slow
def test_a_gpu_preset_without_a_gpu_under_torchrun_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    result = run_training("--launcher", "torchrun", "--preset", "smoke", "--init", "random", env=rank)
    line = one_line_error(result)
    assert "--preset smoke trains on GPUs" in line and "--no-gpu" in line
