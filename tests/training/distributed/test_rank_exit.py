"""How a rank's process ends: its group torn down after a barrier, then the process ended with its
exit code and what it printed flushed, without interpreter finalization (no exit handler runs).
Why ranks end so is tests/training/model/test_causal_lm.py's `test_gloo_threads_outlive_destroy_process_group`."""

from __future__ import annotations

import os
import subprocess
import sys

import torch.distributed as dist

from tests.harness.paths import REPO_ROOT
from training.distributed.rank_exit import tear_down_process_group

# A one-rank gloo group, an exit handler, and a write to a pipe that nothing flushes but the exit.
RANK = """
import atexit, sys
import torch.distributed as dist
from training.distributed.rank_exit import end_rank_process
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
atexit.register(print, "finalized")
sys.stdout.write("printed, not flushed")
end_rank_process(3)
"""


def test_tearing_down_destroys_the_group_and_without_one_does_nothing():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tear_down_process_group()
    assert not dist.is_initialized()
    tear_down_process_group()
    assert not dist.is_initialized()


def test_a_rank_ends_with_its_code_and_its_output_flushed_without_finalizing():
    result = subprocess.run(
        [sys.executable, "-c", RANK],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "printed, not flushed"
