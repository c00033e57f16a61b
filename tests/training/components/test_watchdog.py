"""The hang watchdog's judgements over heartbeats (fake times, never the machine's), the line it
writes, the collective it reads off a stack, and a real two-rank gloo group in which one rank stops
itself with SIGSTOP mid-collective: the other names it within the limit and exits."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from training.components.watchdog import (
    BETWEEN,
    FIRST_STEP_LIMIT_S,
    HANG_EXIT_CODE,
    IN_STEP,
    STALE_S,
    STORE_TIMEOUT_S,
    Beat,
    HangError,
    HangWatchdog,
    Verdict,
    expected_step_s,
    hang_cause,
    hang_limit_s,
    hang_line,
    judge,
    last_recorded_collective,
    waiting_collective,
)
from training.config.presets import PRESETS

NOW = 1_000_000.0


def beat(age: float, step: int, phase: str = IN_STEP) -> Beat:
    return Beat(NOW - age, step, phase)


def test_the_limit_is_twice_the_median_recent_step_plus_the_margin():
    assert expected_step_s([]) is None
    assert expected_step_s([1.0, 9.0, 2.0]) == 2.0
    # Only the recent steps count: a slow start ages out.
    assert expected_step_s([100.0] * 5 + [1.0] * 20) == 1.0
    assert hang_limit_s(2.0, 30.0) == 34.0
    assert hang_limit_s(None, 30.0) == FIRST_STEP_LIMIT_S + 30.0


def test_the_default_margin_is_declared_once_for_every_preset():
    assert {preset["hang_margin_s"] for preset in PRESETS.values()} == {30.0}


def test_a_stopped_rank_whose_heartbeat_went_stale_in_the_step_did_not_arrive():
    beats = {0: beat(0.1, 7), 1: beat(STALE_S + 1, 7)}
    assert judge(beats, NOW, 7, 2, step_over=True, limit_s=10.0) == Verdict(hung=True, lagging=(1,))
    # Before the step runs past its limit the same heartbeats are no hang yet.
    assert not judge(beats, NOW, 7, 2, step_over=False, limit_s=10.0).hung


def test_a_rank_gone_longer_than_the_limit_is_a_hang_in_any_phase():
    """This rank writes its checkpoint or waits in a report's barrier, outside the armed step."""
    beats = {0: beat(0.1, 7, BETWEEN), 1: beat(11.0, 7, IN_STEP)}
    assert judge(beats, NOW, 7, 2, step_over=False, limit_s=10.0) == Verdict(hung=True, lagging=(1,))
    assert judge({0: beat(0.1, 7, BETWEEN)}, NOW, 7, 2, step_over=False, limit_s=10.0).lagging == (1,)


def test_a_live_rank_still_writing_the_last_steps_checkpoint_is_waited_for():
    beats = {0: beat(0.1, 8, IN_STEP), 1: beat(0.1, 7, BETWEEN)}
    assert not judge(beats, NOW, 8, 2, step_over=True, limit_s=10.0).hung


def test_every_rank_alive_inside_the_step_past_its_limit_is_a_deadlock():
    beats = {0: beat(0.1, 8), 1: beat(0.2, 8)}
    assert judge(beats, NOW, 8, 2, step_over=True, limit_s=10.0) == Verdict(hung=True, lagging=())


def test_a_rank_behind_the_step_did_not_arrive():
    beats = {0: beat(0.1, 8), 1: beat(0.1, 6, BETWEEN), 2: beat(0.1, 8)}
    assert judge(beats, NOW, 8, 3, step_over=True, limit_s=10.0).lagging == (1,)


def test_a_silent_store_names_its_host():
    assert judge(None, NOW, 8, 2, step_over=True, limit_s=10.0) == Verdict(True, (0,), unanswered=True)


def test_the_collective_is_the_innermost_c10d_frame_else_ray_train_else_the_innermost():
    sep = os.sep
    c10d = f"{sep}x{sep}torch{sep}distributed{sep}distributed_c10d.py"
    fsdp = f"{sep}x{sep}torch{sep}distributed{sep}fsdp{sep}_fully_shard{sep}_fsdp_collectives.py"
    loop = f"{sep}x{sep}training{sep}loop.py"
    stack = [(loop, "train", 1), (fsdp, "foreach_all_gather", 2), (c10d, "all_gather_into_tensor", 3)]
    assert waiting_collective(stack) == "all_gather_into_tensor (distributed_c10d.py:3)"
    assert waiting_collective(stack[:2]) == "foreach_all_gather (_fsdp_collectives.py:2)"
    ray = f"{sep}x{sep}ray{sep}train{sep}v2{sep}_internal{sep}execution{sep}collective_impl.py"
    assert waiting_collective([(loop, "train", 1), (ray, "barrier", 9)]) == "barrier (collective_impl.py:9)"
    assert waiting_collective([(loop, "train", 1)]) == "train (loop.py:1)"
    assert waiting_collective([]) == "an unknown frame"


def test_the_flight_recorders_last_entry():
    """The shape torch 2.13's `_dump_fr_trace_json` returned for a gloo all_reduce in this project
    (torch/csrc/distributed/c10d/FlightRecorder: entries with profiling_name and collective_seq_id)."""
    dump = json.dumps(
        {
            "version": "2.10",
            "entries": [
                {"profiling_name": "gloo:broadcast", "collective_seq_id": 1},
                {"profiling_name": "gloo:all_reduce", "collective_seq_id": 2, "state": "scheduled"},
            ],
        }
    )
    assert last_recorded_collective(dump) == "gloo:all_reduce #2"
    assert last_recorded_collective(json.dumps({"entries": []})) is None
    assert last_recorded_collective(None) is None


def test_the_line_names_the_ranks_the_collective_and_the_limit():
    line = hang_line(
        rank=0,
        step=34,
        waited_s=5.5,
        expected_s=0.16,
        margin_s=5.0,
        verdict=Verdict(True, (1,)),
        collective="all_reduce (distributed_c10d.py:3252)",
        recorded="gloo:all_reduce #137",
    )
    assert line == (
        "hang at step 34: rank(s) 1 did not arrive; rank 0 waits in all_reduce (distributed_c10d.py:3252); "
        "flight recorder's last: gloo:all_reduce #137 for 5.5 s (limit 5.3 s: 2 x 0.16 s expected + 5 s "
        "--hang-margin-s); ending the attempt to restart from the latest checkpoint"
    )
    assert "\n" not in line
    assert "store does not answer: rank 0" in hang_line(
        rank=1,
        step=3,
        waited_s=9.0,
        expected_s=None,
        margin_s=5.0,
        verdict=Verdict(True, (0,), True),
        collective="x",
        recorded=None,
    )


def test_the_attempts_cause_is_the_finding_and_its_node_the_first_rank_that_did_not_arrive():
    """Not the node of the rank that found the hang and exited (gloo): a repeated failure on one
    node is judged by this node."""
    note = {
        "cause": "hang at step 24: rank(s) 2, 3 did not arrive; rank 0 waits in all_reduce",
        "ranks": [2, 3],
    }
    hosts = {0: "worker-a", 2: "worker-b", 3: "worker-b"}
    assert hang_cause(note, hosts, 240) == (note["cause"], "worker-b")
    assert hang_cause({**note, "ranks": []}, hosts, 240)[1] is None  # a deadlock: no rank missing
    cut, _ = hang_cause(note, hosts, 20)
    assert len(cut) == 20 and cut.endswith("…")


def test_a_collective_that_raises_after_the_watchdogs_abort_raises_its_finding():
    watchdog = HangWatchdog(0, 1, 30.0, store=None, emit=lambda line: None)
    with pytest.raises(RuntimeError, match="boom"), watchdog.step(1):
        raise RuntimeError("boom")
    watchdog.finding = "hang at step 2: rank(s) 1 did not arrive"
    with pytest.raises(HangError, match=r"^hang at step 2: rank"), watchdog.step(2):
        raise RuntimeError("Connection closed by peer")
    assert len(watchdog.step_times) == 0  # a step that raised is no step time


def _rank(rank: int, port: int, margin_s: float, out: str, stops: int) -> None:
    """Rank `stops` stops itself inside an all_reduce's step; the other's watchdog must name it."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    def emit(line: str) -> None:
        Path(out, f"{rank}.line").write_text(line)

    watchdog = HangWatchdog.start(rank, 2, margin_s, emit)
    Path(out, f"{rank}.pid").write_text(str(os.getpid()))
    for step in range(1, 6):
        with watchdog.step(step):
            time.sleep(0.05)
            if rank == stops and step == 5:
                Path(out, "stopped").write_text(str(time.time()))
                os.kill(os.getpid(), signal.SIGSTOP)
            dist.all_reduce(torch.ones(1))
    Path(out, f"{rank}.done").write_text("")  # never reached by rank 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow  # about 6 s each: two spawned gloo ranks, one stopped, wait for the limit
@pytest.mark.parametrize(
    ("stops", "named"),
    [
        (1, "hang at step 5: rank(s) 1 did not arrive; rank 0 waits in all_reduce ("),
        # Rank 0 hosts the store: the other finds it silent.
        (0, "hang at step 5: the process group's store does not answer: rank 0 (its host under Ray"),
    ],
    ids=["a rank", "the store's host"],
)
def test_a_rank_stopped_mid_step_is_named_by_the_other_which_exits(tmp_path, capfd, stops, named):
    margin_s = 2.0
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    args = (port, margin_s, str(tmp_path), stops)
    ranks = [context.Process(target=_rank, args=(rank, *args)) for rank in range(2)]
    waiting = 1 - stops
    for process in ranks:
        process.start()
    try:
        ranks[waiting].join(timeout=120)
        assert ranks[waiting].exitcode == HANG_EXIT_CODE
        detected = time.time()
    finally:
        for process in ranks:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGKILL)
                process.join()
    stopped = float((tmp_path / "stopped").read_text())
    err = capfd.readouterr().err
    # Each step is ~0.05 s: the limit is 2 x that + the margin; a tick, the process's exit and, for a
    # silent store, its two timed-out calls added.
    assert detected - stopped < 2 * 0.1 + margin_s + 2.0 + (0 if stops else 2 * STORE_TIMEOUT_S)
    assert "Current thread" in err or "Thread 0x" in err  # the stacks, dumped
    assert not (tmp_path / f"{waiting}.done").exists()
    assert (tmp_path / f"{waiting}.line").read_text().startswith(named)
