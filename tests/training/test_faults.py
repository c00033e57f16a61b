"""Faults on a real `python -m training --local` run (embedded Ray, tiny preset, 2 CPU workers):
a worker stopped with SIGSTOP mid-run is named and the run restarts and finishes; a SIGTERM to the
driver drains the embedded node and exits once the checkpoint of the step in progress is committed."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.paths import REPO_ROOT
from training.components.checkpoint import is_complete
from training.components.drain import DRAINED_EXIT_CODE
from training.components.watchdog import TICK_S

STEP = re.compile(r"\(RayTrainWorker pid=(\d+)\) step\s+(\d+)/\d+ \| .* \| ([\d.]+) s/step")
MARGIN_S = 5.0


def _descendants(root: int) -> list[int]:
    """The process tree under `root`, read from /proc (Linux): this run's Ray workers only, not
    those of another run on the same machine."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _train_workers(root: int) -> list[int]:
    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_text()
        except OSError:
            return ""

    return [pid for pid in _descendants(root) if "RayTrainWorker" in command(pid)]


def _start(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training",
            "--local",
            "--storage-path",
            str(tmp_path),
            "--run-name",
            "run",
            *flags,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_a_worker_stopped_mid_run_is_named_and_the_run_restarts_and_finishes(tmp_path):
    run = _start(
        tmp_path,
        "--steps",
        "80",
        "--checkpoint-every",
        "10",
        "--max-failures",
        "2",
        "--hang-margin-s",
        str(MARGIN_S),
    )
    step_times: list[float] = []
    rank0, stopped, stopped_at, finding, detected = None, None, 0.0, "", 0.0
    lines = []
    try:
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            if (match := STEP.search(line)) and stopped is None:
                rank0 = rank0 or int(match.group(1))
                step_times.append(float(match.group(3)))
                if int(match.group(2)) == 23:  # between checkpoints (10, 20, 30)
                    stopped = next(pid for pid in _train_workers(run.pid) if pid != rank0)
                    os.kill(stopped, signal.SIGSTOP)
                    stopped_at = time.monotonic()
            if "hang at step" in line and not finding:
                finding, detected = line, time.monotonic()
        assert run.wait(timeout=300) == 0, "".join(lines[-30:])
    finally:
        if run.poll() is None:
            run.kill()
        if stopped is not None and Path(f"/proc/{stopped}").exists():
            os.kill(stopped, signal.SIGKILL)
    expected = statistics.median(step_times[1:])
    detection_s = detected - stopped_at
    print(f"detection {detection_s:.2f} s; expected step {expected:.3f} s; margin {MARGIN_S} s")
    # The stop lands anywhere in step 24; the waiting rank's limit counts from that step's start.
    assert detection_s <= 2 * expected + MARGIN_S + TICK_S + 1.0
    assert "rank(s) 1 did not arrive; rank 0 waits in " in finding
    assert re.search(r"waits in (all_reduce|all_gather_into_tensor|reduce_scatter_tensor|\w+) \(", finding)
    output = "".join(lines)
    assert re.search(r"step 80/80", output)
    summary = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    # The attempt as training.components.attempts records it: stopped in step 24, resumed from the
    # latest committed checkpoint (step 20's is written behind the steps after it and may not be
    # committed yet: then step 10's); the controller's last step may trail the workers'.
    (attempt,) = summary["attempts"]
    print(f"attempt: {attempt}")
    assert summary["restarts"] == 1
    # The watchdog's finding is the cause, not the death of rank 0, which found it and exited.
    assert attempt["cause"] == finding.split(") ", 1)[1].strip()
    resumed = attempt["resumed_from_step"]
    assert resumed in (10, 20)
    assert f"resumed from step {resumed}" in output
    assert 20 <= attempt["failed_after_step"] <= 23
    assert attempt["lost_steps"] == attempt["failed_after_step"] - resumed


@pytest.mark.slow
def test_a_sigterm_to_the_driver_commits_the_step_in_progress_before_exit(tmp_path):
    run = _start(tmp_path, "--steps", "2000", "--checkpoint-every", "0")
    signalled_at_step, signalled, committed, lines = 0, 0.0, None, []
    try:
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            if (match := STEP.search(line)) and not signalled_at_step and int(match.group(2)) >= 20:
                signalled_at_step, signalled = int(match.group(2)), time.monotonic()
                run.send_signal(signal.SIGTERM)
            if line.startswith("SIGTERM: checkpoint of step"):
                committed = line
        assert run.wait(timeout=120) == DRAINED_EXIT_CODE, "".join(lines[-30:])
        exited_s = time.monotonic() - signalled
    finally:
        if run.poll() is None:
            run.kill()
    assert committed is not None, "".join(lines[-30:])
    step = int(re.search(r"checkpoint of step (\d+)", committed).group(1))  # type: ignore[union-attr]
    notice = next(line for line in lines if "drain notice (Ray Train preemption of node" in line)
    # The checkpoint is of the step the notice found in progress, after the signal.
    assert f"checkpointing step {step} before" in notice
    assert step >= signalled_at_step
    assert is_complete(str(tmp_path / "run" / f"checkpoint_{step:06d}"))
    assert exited_s < 30.0
    print(
        f"SIGTERM at step {signalled_at_step}; step {step} committed; exit {exited_s:.1f} s after the signal"
    )


def _torchrun_sigterm(tmp_path: Path, name: str, after_step: int) -> tuple[int, str, int]:
    """One torchrun run of 2 gloo ranks SIGTERMed once step `after_step` is printed: the exit
    status, the committed line, and the step the signal found in progress."""
    run = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--nproc-per-node=2",
            "-m",
            "training",
            "--launcher",
            "torchrun",
            "--steps",
            "2000",
            "--checkpoint-every",
            "0",
            "--no-tensorboard",
            "--storage-path",
            str(tmp_path),
            "--run-name",
            name,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    committed, in_progress = "", 0
    try:
        assert run.stdout is not None
        for line in run.stdout:
            match = re.match(r"step\s+(\d+)/", line)
            if match and not in_progress and int(match.group(1)) >= after_step:
                in_progress = int(match.group(1)) + 1
                run.send_signal(signal.SIGTERM)
            if line.startswith("SIGTERM: checkpoint of step"):
                committed = line
        return run.wait(timeout=60), committed, in_progress
    finally:
        if run.poll() is None:
            run.kill()


@pytest.mark.slow
def test_twenty_sigterms_under_torchrun_each_commit_the_step_in_progress(tmp_path):
    """torchrun forwards its SIGTERM to both ranks and SIGKILLs them 30 s later; each try must
    commit the step in progress (or the next, when the signal lands after its all-reduce) first."""
    committed_steps = []
    for attempt in range(20):
        after = 2 + attempt % 7
        started = time.monotonic()
        _, committed, in_progress = _torchrun_sigterm(tmp_path, f"try{attempt}", after)
        took = time.monotonic() - started
        assert committed, f"try {attempt}: no checkpoint committed"
        step = int(re.search(r"checkpoint of step (\d+)", committed).group(1))  # type: ignore[union-attr]
        assert step in (in_progress, in_progress + 1), (attempt, step, in_progress)
        assert is_complete(str(tmp_path / f"try{attempt}" / f"checkpoint_{step:06d}"))
        committed_steps.append((step, round(took, 1)))
    print(f"20 of 20 committed: {committed_steps}")
