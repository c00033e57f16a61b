"""The --local driver's drain: its reading of Ray Train's checkpoint manager snapshot and its last
line (the SIGTERM itself: tests/training/test_faults.py, slow)."""

from __future__ import annotations

import json

from training.components.drain import DRAINED_EXIT_CODE
from training.launch.local_drain import checkpoint_step, committed_checkpoint, drained_line


def test_the_driver_reads_the_latest_committed_checkpoint_from_ray_trains_snapshot():
    """The snapshot's shape: ray 2.58 ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py
    `_CheckpointManagerState` (latest_checkpoint_result: a `_TrainingResultState` or null)."""
    snapshot = {
        "ray_version": "2.58.0",
        "checkpoint_results": [{"version": 0, "checkpoint_dir_name": "checkpoint_000057", "metrics": {}}],
        "checkpoint_report_indices": [0],
        "latest_checkpoint_result": {"version": 0, "checkpoint_dir_name": "checkpoint_000057", "metrics": {}},
    }
    assert committed_checkpoint(json.dumps(snapshot)) == "checkpoint_000057"
    assert committed_checkpoint(json.dumps({**snapshot, "latest_checkpoint_result": None})) is None
    assert committed_checkpoint(None) is None
    assert checkpoint_step("checkpoint_000057") == 57


def test_the_drivers_last_line():
    line = drained_line("/runs/r", "r", "checkpoint_000050", "checkpoint_000057", 4.0)
    assert line.startswith("SIGTERM: checkpoint of step 57 committed (/runs/r/checkpoint_000057) 4.0 s after")
    assert "--run-name r` with the same flags resumes from it" in line
    missed = drained_line("/runs/r", "r", "checkpoint_000050", "checkpoint_000050", 29.0)
    assert missed.startswith(
        "SIGTERM: no checkpoint committed within 29.0 s of the drain; the latest is step 50"
    )
    assert DRAINED_EXIT_CODE == 143
