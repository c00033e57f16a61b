"""The files a finished run leaves in its folder: summary.json with the run's folder, its own path
and the history, and run.png beside it when there is a history to draw and matplotlib to draw it;
and the closing line for people, after the JSON summary."""

from __future__ import annotations

import json
import sys

from training.metrics.artifacts import (
    PICTURE_FILE,
    SUMMARY_FILE,
    closing_line,
    render_picture,
    write_run_files,
)
from training.metrics.report import SUMMARY_KEYS, format_summary, parse_summary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SUMMARY = {"model": "tiny", "world_size": 2, "device": "cpu", "seq_len": 128, "batch_size": 8, "mfu": None}
HISTORY = [
    {"step": 1, "loss": 5.5, "tokens_per_s": 900.0},
    {"step": 2, "loss": 4.5, "tokens_per_s": 1000.0, "eval_loss": 4.75},
]


def written(run_dir: str, history: list[dict]) -> tuple[dict[str, bytes], dict]:
    files: dict[str, bytes] = {}
    summary = write_run_files(files.__setitem__, run_dir, SUMMARY, history)
    return files, summary


def test_the_summary_names_the_run_folder_and_its_own_path_and_holds_the_history():
    files, summary = written("s3://bucket/runs/job-1/", HISTORY)
    assert summary == {
        **SUMMARY,
        "run_dir": "s3://bucket/runs/job-1/",
        "summary_path": f"s3://bucket/runs/job-1/{SUMMARY_FILE}",
    }
    assert json.loads(files[SUMMARY_FILE]) == {**summary, "history": HISTORY}


def test_a_run_with_a_history_gets_its_picture_and_one_without_none():
    files, _ = written("runs/job-1", HISTORY)
    assert files.keys() == {PICTURE_FILE, SUMMARY_FILE}
    assert files[PICTURE_FILE].startswith(PNG_SIGNATURE)
    files, _ = written("runs/job-2", [])
    assert files.keys() == {SUMMARY_FILE}


def test_without_matplotlib_there_is_no_picture_and_one_note(monkeypatch, capsys):
    """A None entry in sys.modules makes `import` raise ImportError, as a missing package does."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert render_picture(SUMMARY, HISTORY) is None
    assert capsys.readouterr().err == "matplotlib is not installed: no run picture\n"
    files, _ = written("runs/job-1", HISTORY)
    assert files.keys() == {SUMMARY_FILE}


def test_the_closing_line_gives_the_loss_the_time_the_folder_and_how_to_resume_and_no_json():
    summary = {
        **dict.fromkeys(SUMMARY_KEYS, 1),
        "loss_first": 5.55164,
        "loss_last": 2.77351,
        "duration_s": 83.4,
        "steps_run": 30,
        "run_name": "tiny-20261206-170000-42",
        "run_dir": "/home/me/runs/tiny-20261206-170000-42",
    }
    line = closing_line(summary)
    assert line == (
        "done: loss 5.5516 -> 2.7735 in 1m23s (30 steps); the run folder "
        "/home/me/runs/tiny-20261206-170000-42 holds run.png, the TensorBoard events (tensorboard/) "
        "and the checkpoints; the same command with --run-name tiny-20261206-170000-42 resumes from "
        "its latest checkpoint"
    )
    assert PICTURE_FILE in line and "{" not in line
    # A log parser still finds the JSON summary before it, and takes the line for none.
    assert parse_summary(f"{format_summary(summary)}\n{line}\n") == json.loads(format_summary(summary))
    assert parse_summary(line) is None
    assert "loss n/a -> n/a" in closing_line({**summary, "loss_first": None, "loss_last": None})
    # A summary with the keys every summary holds alone: the run folder names the run.
    bare = {key: summary[key] for key in SUMMARY_KEYS}
    assert closing_line(bare).endswith(
        "--run-name tiny-20261206-170000-42 resumes from its latest checkpoint"
    )
