"""Restart in place, as a user meets it: `python -m training --local --checkpoint-every 5` with one
Ray Train worker process SIGKILLed mid-run finishes every step with no other flag (the presets'
--max-failures 3), loses at most one checkpoint interval, recovers within a minute on a 2-core
machine and ends at the uninterrupted run's loss."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.harness.cli_runs import REPO_ROOT, RUN_TIMEOUT_S, printed_summary, run_cli, step_lines
from tests.harness.train_workers import RANK_0_PID, train_workers
from training.metrics.report import parse_step_line

pytestmark = pytest.mark.slow

STEPS, CHECKPOINT_EVERY, KILL_AFTER = 20, 5, 8
FLAGS = ("--local", "--checkpoint-every", str(CHECKPOINT_EVERY), "--steps", str(STEPS))
MAX_LOST_STEPS = 10  # one interval, plus a checkpoint in flight
MAX_RECOVERY_S = 60.0


def test_a_killed_worker_restarts_in_place_and_the_run_ends_as_the_uninterrupted_one(tmp_path):
    command = [
        sys.executable,
        "-m",
        "training",
        *FLAGS,
        "--storage-path",
        str(tmp_path),
        "--run-name",
        "killed",
    ]
    lines: list[tuple[float, str]] = []
    killed_at, victim = None, None
    with open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append((time.monotonic(), line))
                step = parse_step_line(line)
                if killed_at is None and step is not None and step["step"] == KILL_AFTER:
                    prefix = RANK_0_PID.search(line)
                    assert prefix is not None, line
                    rank_0 = int(prefix.group(1))
                    # Rank 1: a worker other than the one that prints, as a lost node's would be.
                    victim = next(pid for pid in train_workers(process.pid) if pid != rank_0)
                    os.kill(victim, signal.SIGKILL)
                    killed_at = time.monotonic()
            process.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    stdout = "".join(line for _, line in lines)
    assert victim is not None and killed_at is not None
    assert process.returncode == 0, (tmp_path / "stderr.txt").read_text()[-4000:]

    # Every step finished, the ones after the checkpoint replayed once.
    timed = [(at, entry) for at, line in lines if (entry := parse_step_line(line)) is not None]
    numbers = [entry["step"] for _, entry in timed]
    restart = next(index for index in range(1, len(numbers)) if numbers[index] <= numbers[index - 1])
    resumed_from, reached = numbers[restart] - 1, numbers[restart - 1]
    assert numbers[restart:] == list(range(resumed_from + 1, STEPS + 1))
    lost = reached - resumed_from
    recovery_s = timed[restart][0] - killed_at
    print(
        f"measured: resumed from step {resumed_from}, {lost} steps lost, {recovery_s:.1f} s kill to next step"
    )
    assert 0 <= lost <= MAX_LOST_STEPS
    assert recovery_s <= MAX_RECOVERY_S

    # The attempt, in the restart's line and the summary (printed and summary.json).
    summary = printed_summary(stdout)
    assert summary["restarts"] == 1
    [attempt] = summary["attempts"]
    assert attempt["attempt"] == 1 and attempt["resumed_from_step"] == resumed_from
    assert attempt["cause"].startswith("rank 1 on ") and " died" in attempt["cause"]
    # The controller's last step is the last every worker reported: it may trail the printed one.
    assert resumed_from <= attempt["failed_after_step"] <= reached
    assert attempt["lost_steps"] == attempt["failed_after_step"] - resumed_from
    assert 0 < attempt["recovery_s"] <= recovery_s + 1.0
    restart_lines = [line for _, line in lines if " restart 1 of 3 after rank 1 on " in line]
    assert len(restart_lines) == 1 and f"resumed from step {resumed_from}," in restart_lines[0]
    saved = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert saved["attempts"] == summary["attempts"]

    # The same data replayed and the same RNG: the last loss is the uninterrupted run's, exactly.
    uninterrupted = run_cli(*FLAGS, "--storage-path", str(tmp_path), "--run-name", "whole")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-4000:]
    whole = printed_summary(uninterrupted.stdout)
    assert (whole["restarts"], whole["attempts"]) == (0, [])
    assert summary["loss_last"] == whole["loss_last"]
    assert step_lines(uninterrupted.stdout)[-1]["loss"] == timed[-1][1]["loss"]


def test_a_second_fault_past_the_recovery_budget_ends_the_run_in_one_line(tmp_path):
    """--recovery-budget-s 1: the first restart is made (no recovery spent before it), and takes
    more than a second; a worker killed after it then ends the run with exit 1 and one line."""
    command = [
        sys.executable, "-m", "training", *FLAGS, "--recovery-budget-s", "1",
        "--storage-path", str(tmp_path), "--run-name", "budget",
    ]  # fmt: skip
    kills: list[int] = []
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        restarted = False
        for line in process.stdout:
            restarted = restarted or " restart 1 of 3 after " in line
            step = parse_step_line(line)
            # Kill once after step 3, and once more after the restart's second step.
            if (
                step is not None
                and (len(kills), restarted) in ((0, False), (1, True))
                and step["step"] in (3, 7)
            ):
                prefix = RANK_0_PID.search(line)
                assert prefix is not None, line
                victim = next(pid for pid in train_workers(process.pid) if pid != int(prefix.group(1)))
                os.kill(victim, signal.SIGKILL)
                kills.append(victim)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert len(kills) == 2 and process.returncode == 1, stderr[-4000:]
    last = stderr.strip().splitlines()[-1]
    assert re.match(r"training failed: 1 restarts spent \d+ s recovering, --recovery-budget-s 1: ", last), (
        last
    )
    # Ray's controller logs each worker death with its traceback before; the run's own error is one line.
    assert "raise --recovery-budget-s" in last and "Traceback" not in last
