"""The NCCL hang benchmark's CPU smoke run (`--backend gloo`): the NCCL recorder reads nothing here,
and the hanging child prints the hang line and exits with HANG_EXIT_CODE."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.program import ROOT
from training.components.watchdog import HANG_EXIT_CODE

# Some 6 s: the benchmark and its child each import torch and start a one-rank gloo group.
pytestmark = pytest.mark.slow


def test_on_gloo_the_nccl_read_is_empty_and_the_stalled_child_exits_with_the_hang_code(tmp_path):
    out = tmp_path / "nccl-hang-read.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.nccl_hang_read", "--backend", "gloo", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["checks"]["nccl_recorder_read_is_empty"]
    assert report["command"] == f"python -m bench.nccl_hang_read --backend gloo --out {out}"
    assert report["reads"]["group_id"] is None
    hang = report["hang"]
    assert hang["exit_code"] == HANG_EXIT_CODE and hang["stacks_dumped"]
    assert hang["line"].startswith(
        "hang at step 4: every rank is in the step and alive: a collective deadlock"
    )
    assert hang["seconds_from_stall_to_exit"] < 5
