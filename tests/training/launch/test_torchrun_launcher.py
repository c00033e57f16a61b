"""The torchrun launcher's session on one rank of a one-rank gloo group, over a run folder made for
each test: the checkpoint a run resumes from, the folders it keeps, and the files a finished run
leaves. Its methods against the `Session` protocol are tests/training/test_session.py's; whole runs
under torchrun are tests/training/launch/test_ray_launcher.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from training.config.run_config import TRAIN_STATE_FILE, parse_flags
from training.launch.torchrun_launcher import TorchrunSession
from training.metrics.artifacts import SUMMARY_FILE
from training.metrics.report import SUMMARY_KEYS, parse_summary


@pytest.fixture
def session(tmp_path, monkeypatch) -> TorchrunSession:
    """Rank 0 of 1, as torchrun's environment names it, writing under tmp_path/run."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = parse_flags(["--storage-path", str(tmp_path), "--run-name", "run", "--keep-checkpoints", "2"])
    return TorchrunSession(config, torch.device("cpu"))


def committed(session: TorchrunSession, step: int, **state) -> Path:
    """A checkpoint folder of `step`: DCP's shards and metadata, then the train state that completes
    it, as rank 0 writes it."""
    folder = Path(session.checkpoint_folder(step))
    dcp.save({"weight": torch.full((4,), float(step))}, checkpoint_id=folder, no_dist=True)
    (folder / TRAIN_STATE_FILE).write_text(json.dumps({"step": step, **state}))
    return folder


def test_the_latest_complete_checkpoint_is_resumed_from_else_the_one_named(tmp_path, monkeypatch, session):
    with session.latest_checkpoint() as found:
        assert found is None
    monkeypatch.setattr(session, "resume_from", str(tmp_path / "elsewhere"))
    with session.latest_checkpoint() as found:
        assert found == str(tmp_path / "elsewhere")
    committed(session, 2)
    session.checkpoint_folder(3)  # begun, never completed
    with session.latest_checkpoint() as found:
        assert found == str(tmp_path / "run" / "checkpoint_000002")


def test_a_complete_checkpoint_missing_a_shard_gives_way_to_the_newest_whole_one(session, capsys):
    committed(session, 2)
    broken = committed(session, 4)
    (broken / "__0_0.distcp").unlink()
    with session.latest_checkpoint() as found:
        assert found == str(session.run_dir / "checkpoint_000002")
    (line,) = capsys.readouterr().out.splitlines()
    assert line == (
        f"checkpoint {broken} is not whole (__0_0.distcp: missing): resuming from the newest whole one, "
        f"{session.run_dir / 'checkpoint_000002'}"
    )


def test_a_commit_keeps_the_latest_checkpoints_and_drops_earlier_incomplete_ones(session, one_rank_group):
    for step in (1, 2, 3):
        committed(session, step)
    session.checkpoint_folder(4)  # a killed run's write, never completed
    last = committed(session, 5)
    session.publish({}, 5, str(last))
    assert sorted(path.name for path in session.run_dir.iterdir()) == [
        "checkpoint_000003",
        "checkpoint_000005",
    ]


def test_rank_0_writes_the_summary_into_the_run_folder(session, capsys):
    values = {**dict.fromkeys(SUMMARY_KEYS, 1), "world_size": 1, "mfu": None, "gpu_name": None}
    session.finish(values, [])
    summary = json.loads((session.run_dir / SUMMARY_FILE).read_text())
    assert summary["run_dir"] == str(session.run_dir) and summary["history"] == []
    assert parse_summary(capsys.readouterr().out)["summary_path"] == str(session.run_dir / SUMMARY_FILE)
    assert session.faults() == []
