"""The log files the transport verdict reads: folders walked for Ray's log suffixes and rotated parts,
carriage returns splitting lines, and unreadable input refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.nccl_lines import (
    EFA_PROVIDER,
    ORIGIN_A,
    ORIGIN_B,
    RECEIVE_SOCKET,
    SEND_LIBFABRIC,
    info,
    write_bytes,
)
from workloads.nccl_logs import UnreadableLogError
from workloads.nccl_transport import classify_files


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def test_folder_walk_reads_ray_rotated_worker_logs(tmp_path):
    """Ray 2.58 rotates `worker-<id>-<job>-<pid>.out` by size into `.out.1`, `.out.2`, ..."""
    (tmp_path / "worker-01-02000000-4711.out").write_text("TRAIN_STEP {}\n")
    (tmp_path / "worker-01-02000000-4711.out.1").write_text(info(ORIGIN_B, RECEIVE_SOCKET) + "\n")

    assert classify_files([tmp_path]).transport == "socket"


def test_folder_walk_reads_only_log_suffixes(tmp_path):
    nested = tmp_path / "session_latest" / "logs"
    nested.mkdir(parents=True)
    (nested / "worker-01.out").write_text(
        "\n".join(info(ORIGIN_A, m) for m in (EFA_PROVIDER, SEND_LIBFABRIC)) + "\n"
    )
    (nested / "notes.txt").write_text(info(ORIGIN_B, RECEIVE_SOCKET))

    assert classify_files([tmp_path]).transport == "efa"


def test_carriage_returns_split_progress_bars_from_nccl_lines(tmp_path):
    log = tmp_path / "worker.out"
    channel = info(ORIGIN_B, RECEIVE_SOCKET)
    log.write_bytes(b"Downloading shards:  50%|#####     | 1/2\r" + channel.encode() + b"\n")

    verdict = classify_files([log])

    assert (verdict.transport, verdict.evidence) == ("socket", [channel])


@pytest.mark.parametrize(
    "make_input",
    [
        lambda tmp: tmp / "missing.log",
        lambda tmp: write_bytes(tmp / "core.out", b"\x7fELF\x02\x01\x01\x00\x00\x00NCCL INFO"),
        lambda tmp: _mkdir(tmp / "empty"),
    ],
    ids=["missing", "binary", "folder-without-logs"],
)
def test_unreadable_input_raises(tmp_path, make_input):
    with pytest.raises(UnreadableLogError):
        classify_files([make_input(tmp_path)])
