"""Checkpoints written behind the next steps (training/components/async_checkpoint.py): the
cadence's rule, the commit every rank agrees on, a write cut short by a kill, and the equality of
an async checkpoint with a synchronous one of the same step.

The ranks are spawned gloo processes (as tests/training/components/test_deadline.py's) or torchrun
ranks of `python -m training --launcher torchrun`. A write still in flight at a kill is made by
delaying the filesystem writer's `write_data` (torch 2.13: torch/distributed/checkpoint/filesystem.py
`_FileSystemWriter.write_data`, which DCP's save calls in its writer thread); one rank's write
ending later than another's, by delaying its `async_save` future's completion (DCP's save ends
with collectives, so delaying one rank's shards delays every rank's).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.harness.cli_runs import REPO_ROOT, RUN_TIMEOUT_S, step_lines
from training.components.async_checkpoint import (
    MAX_STALL_FRACTION,
    checkpoint_interval_s,
    commit_line,
    stall_fraction,
    write_cost_s,
)
from training.components.checkpoint import is_complete, read_train_state

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def test_the_interval_keeps_the_stall_under_its_share_of_the_run():
    assert checkpoint_interval_s(300.0, None) == 300.0  # nothing measured yet
    assert checkpoint_interval_s(300.0, 1.5) == 300.0  # 1.5 s of 300: 0.5 %
    assert checkpoint_interval_s(300.0, 15.0) == pytest.approx(500.0)  # 15 s / 0.03
    assert checkpoint_interval_s(0.0, 15.0) == 0.0  # no time-based checkpoints
    for blocking in (0.5, 15.0, 60.0):
        interval = checkpoint_interval_s(300.0, blocking)
        assert stall_fraction(blocking, interval) <= MAX_STALL_FRACTION
    assert stall_fraction(3.0, 97.0) == pytest.approx(0.03)


class _Recorder:
    """The writer's session on one spawned rank: each checkpoint a folder under `root` that every
    rank writes its shards into (as in the run's storage on Ray), and every report and publish in
    order."""

    def __init__(self, rank: int, world_size: int, root: Path) -> None:
        self.rank, self.world_size, self.root = rank, world_size, root
        self.calls: list[tuple] = []
        self.writes: list[int] = []  # the steps whose checkpoint began

    def checkpoint_folder(self, step):
        self.writes.append(step)
        path = self.root / f"checkpoint_{step:06d}"
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def publish(self, metrics, step, folder):
        self.calls.append(("publish", metrics["step"], step, is_complete(folder) or self.rank != 0))

    def report(self, metrics, step, save):
        self.calls.append(("report", step))


def _slow_writes(delay_s: float) -> None:
    """This process's DCP writes sleep `delay_s` before writing their shards."""
    from torch.distributed.checkpoint import filesystem

    original = filesystem._FileSystemWriter.write_data

    def write_data(self, plan, planner):
        time.sleep(delay_s)
        return original(self, plan, planner)

    filesystem._FileSystemWriter.write_data = write_data


def _late_writes(delay_s: float) -> None:
    """This process's async saves report done `delay_s` after their write ended: a rank whose
    writer thread is still busy after the collectives of DCP's save (its own files' close and sync)."""
    import threading
    from concurrent.futures import Future

    import torch.distributed.checkpoint as dcp

    original = dcp.async_save

    def async_save(*args, **kwargs):
        result = original(*args, **kwargs)
        written = result if isinstance(result, Future) else result.upload_completion
        late: Future = Future()
        written.add_done_callback(
            lambda done: threading.Timer(delay_s, lambda: late.set_result(done.result())).start()
        )
        return late

    dcp.async_save = async_save


def _agreeing_ranks(rank: int, init_file: str, root: str, out: str) -> None:
    import torch.distributed as dist

    from training.components.async_checkpoint import CheckpointWriter
    from training.distributed.ballot import StepBallot, step_sync

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    if rank == 1:
        _late_writes(1.5)  # rank 0's write ends within a step, rank 1's some 7 steps later
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = _Recorder(rank, 2, Path(root))
    writer = CheckpointWriter(session, model, optimizer, 0.0, torch.device("cpu"))
    ballot = StepBallot()
    writer.register(ballot)
    steps = 14
    for step in range(1, steps + 1):
        time.sleep(0.2)  # the step's work
        writer.cast(ballot)
        step_sync(torch.tensor(1.0), torch.tensor(1.0), ballot)
        writer.count(ballot)
        state = {"step": step} if step == 2 else None
        writer.report({"step": step}, step, state=state, last=step == steps, save=None)
        with torch.no_grad():
            model.weight.add_(1.0)  # what the next steps change must not reach the checkpoint
    writer.close()
    Path(out, f"{rank}.json").write_text(json.dumps(session.calls))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_commits_at_the_same_step_once_the_slowest_write_ends(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_agreeing_ranks, args=(str(tmp_path / "pg"), str(tmp_path), str(tmp_path)), nprocs=2)
    calls = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    # Ray Train needs the same reports on every rank: one a step, the commit's among them.
    assert calls[0] == calls[1]
    published = [call for call in calls[0] if call[0] == "publish"]
    assert len(published) == 1 and len(calls[0]) == 14
    _, at_step, written_step, complete = published[0]
    assert written_step == 2 and complete
    # Rank 1's write took 1.5 s (7 steps of 0.2 s) beyond rank 0's: rank 0 waited for it.
    assert 2 + 5 <= at_step < 14
    # The checkpoint holds the weights of its step, not the later ones.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(tmp_path / "checkpoint_000002"), str(tmp_path / "flat.pt"))
    torch.manual_seed(0)
    expected = torch.nn.Linear(8, 8).weight + 1.0  # one add, after step 1
    saved = torch.load(tmp_path / "flat.pt")["model"]["weight"]
    assert torch.equal(saved, expected.detach())


def _clocks_apart(rank: int, init_file: str, root: str, out: str) -> None:
    """Rank 1's clock runs 20 times as fast as rank 0's: only rank 1's says the interval passed."""
    import torch.distributed as dist

    from training.components.async_checkpoint import INTERVAL_DUE, CheckpointWriter
    from training.distributed.ballot import StepBallot, step_sync

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    now = [0.0]

    def clock() -> float:
        now[0] += 2.0 if rank == 1 else 0.1
        return now[0]

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = _Recorder(rank, 2, Path(root))
    writer = CheckpointWriter(session, model, optimizer, 5.0, torch.device("cpu"), clock=clock)
    ballot = StepBallot()
    writer.register(ballot)
    votes = []
    steps = 8
    for step in range(1, steps + 1):
        writer.cast(ballot)
        votes.append(ballot.own(INTERVAL_DUE))
        step_sync(torch.tensor(1.0), torch.tensor(1.0), ballot)
        writer.count(ballot)
        last = step == steps
        state = {"step": step} if writer.interval_due and not last else None
        writer.report({"step": step}, step, state=state, last=last, save=None)
    writer.close()
    Path(out, f"{rank}.json").write_text(json.dumps({"writes": session.writes, "votes": votes}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_time_based_checkpoint_falls_on_the_same_step_on_every_rank(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_clocks_apart, args=(str(tmp_path / "pg"), str(tmp_path), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert not any(ranks[0]["votes"]) and any(ranks[1]["votes"])
    assert ranks[0]["writes"] == ranks[1]["writes"] and ranks[0]["writes"]


def _killed_mid_write(init_file: str, root: str) -> None:
    import torch.distributed as dist

    from training.components.async_checkpoint import CheckpointWriter

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    _slow_writes(60.0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = _Recorder(0, 1, Path(root))
    writer = CheckpointWriter(session, model, optimizer, 0.0, torch.device("cpu"))
    writer.report({"step": 1}, 1, state={"step": 1}, last=False, save=None)
    Path(root, "started").touch()
    time.sleep(120)


def test_a_run_killed_with_a_write_in_flight_leaves_no_complete_looking_folder(tmp_path):
    process = multiprocessing.get_context("spawn").Process(
        target=_killed_mid_write, args=(str(tmp_path / "pg"), str(tmp_path))
    )
    process.start()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists()
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
    finally:
        if process.is_alive():
            process.kill()
    folder = tmp_path / "checkpoint_000001"
    assert folder.is_dir() and not is_complete(str(folder))


def test_the_commit_line_says_how_far_behind_what_it_stalled_and_cost():
    assert commit_line(10, 13, 0.084, 0.31) == (
        "checkpoint of step 10 committed at step 13, written behind 3 steps; it stalled training "
        "0.08 s and cost the run 0.31 s in all"
    )


def test_a_checkpoints_cost_is_its_stall_and_the_slowdown_of_the_steps_it_was_behind():
    """Steps of 1 s without a write; three steps behind it took 1.5, 1.2 and 1.0 s: 0.7 s beyond
    three baseline steps, with a 0.2 s stall, 0.9 s."""
    assert write_cost_s(0.2, [1.5, 1.2, 1.0], [1.0, 0.9, 1.1, 1.0]) == pytest.approx(0.9)
    assert write_cost_s(0.2, [0.9, 0.95], [1.0, 1.0]) == 0.2  # faster steps are no saving
    assert write_cost_s(0.2, [3.0], []) == 0.2  # nothing to compare with yet
    # A write behind that slows its steps as much as a synchronous write stalls one is sized so.
    cost = write_cost_s(1.7, [13.0, 13.0], [7.0, 7.0, 7.0])
    assert checkpoint_interval_s(300.0, cost) == pytest.approx(cost / MAX_STALL_FRACTION)


def _torchrun(storage: Path, run_name: str, *flags: str) -> subprocess.CompletedProcess:
    command = [
        *TORCHRUN, "-m", "training", "--launcher", "torchrun", "--no-gpu", "--no-tensorboard",
        "--checkpoint-interval-s", "0", "--storage-path", str(storage), "--run-name", run_name, *flags,
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _untimed(state: dict) -> dict:
    """A train state without what each run timed (a step's time and rate)."""
    timed = ("step_time_s", "tokens_per_s")
    history = [{key: value for key, value in entry.items() if key not in timed} for entry in state["history"]]
    return {**state, "history": history}


def _flat(folder: Path, target: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(folder), str(target))
    return torch.load(target)


@pytest.mark.slow
def test_an_async_checkpoint_equals_a_synchronous_one_and_resumes_as_the_run_went_on(tmp_path):
    """Two torchrun ranks: a run of 6 steps checkpoints step 3 behind its steps 4 to 6; a run of 3
    steps checkpoints its last, step 3, synchronously. Same weights, optimizer state and train
    state; the resume from the async one trains steps 4 to 6 as the first run did."""
    # A write an earlier run left unfinished: no checkpoint to resume from, removed at a commit.
    left = tmp_path / "behind" / "checkpoint_000002"
    left.mkdir(parents=True)
    (left / "__0_0.distcp").write_bytes(b"cut short")
    behind = _torchrun(tmp_path, "behind", "--steps", "6", "--checkpoint-every", "3")
    assert "checkpoint of step 3 committed at step " in behind.stdout
    assert "resumed" not in behind.stdout and not left.exists()
    _torchrun(tmp_path, "sync", "--steps", "3", "--checkpoint-every", "3")
    async_folder, sync_folder = (
        tmp_path / "behind" / "checkpoint_000003",
        tmp_path / "sync" / "checkpoint_000003",
    )
    states = [read_train_state(str(folder)) for folder in (async_folder, sync_folder)]
    assert [_untimed(state) for state in states] == [_untimed(states[1])] * 2 and states[0]["step"] == 3
    written, synchronous = _flat(async_folder, tmp_path / "a.pt"), _flat(sync_folder, tmp_path / "s.pt")
    flat_written = torch.utils._pytree.tree_flatten_with_path(written)[0]
    flat_sync = dict(torch.utils._pytree.tree_flatten_with_path(synchronous)[0])
    assert len(flat_written) == len(flat_sync) > 10
    for path, value in flat_written:
        other = flat_sync[path]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, path

    resumed = _torchrun(
        tmp_path, "resumed", "--steps", "6", "--checkpoint-every", "3", "--resume-from", str(async_folder)
    )
    assert "resumed from step 3" in resumed.stdout
    went_on = {entry["step"]: entry["loss"] for entry in step_lines(behind.stdout)}
    again = {entry["step"]: entry["loss"] for entry in step_lines(resumed.stdout)}
    assert sorted(again) == [4, 5, 6]
    for step, loss in again.items():
        assert loss == pytest.approx(went_on[step], abs=1e-5), step
