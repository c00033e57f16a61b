"""The hang watchdog's judgements over heartbeats (fake times, never the machine's), the limits of
the step, the evaluation and the commit, the NCCL flight recorder's dump as torch 2.13 writes it
(tests/fixtures/flight_recorder: four ranks, one of which never joined the collectives the others
wait in), the line it writes, the exit it ends with, and a real two-rank gloo group in which one
rank stops itself with SIGSTOP mid-collective: the other names it within the limit and exits."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from training.components import watchdog as watchdog_module
from training.components.watchdog import (
    BETWEEN,
    COMMIT,
    EVALUATION,
    FIRST_LIMIT_S,
    HANG_EXIT_CODE,
    IN_STEP,
    LAST_CHECKPOINT,
    STALE_S,
    STORE_TIMEOUT_S,
    Beat,
    Collectives,
    HangError,
    HangJudgement,
    HangWatchdog,
    Limit,
    _Watch,
    expected_s,
    hang_cause,
    hang_line,
    judge,
    oldest_pending,
    phase_limit,
    read_nccl_recorder,
    trailing,
    training_collectives,
    waiting_collective,
)
from training.config.presets import PRESETS

NOW = 1_000_000.0
FIXTURES = Path(__file__).parents[2] / "fixtures" / "flight_recorder"
WORLD = 4
STUCK = 2  # the fixture's rank that never joined collective #65
HOSTS = {0: "worker-a", 1: "worker-a", 2: "worker-b", 3: "worker-b"}


def beat(age: float, step: int, phase: str = IN_STEP, collectives: Collectives | None = None) -> Beat:
    return Beat(NOW - age, step, phase, collectives)


def dump(rank: int) -> dict[str, Any]:
    return json.loads((FIXTURES / f"nccl_trace_rank{rank}.json").read_text())


def test_each_phase_has_its_own_limit():
    assert expected_s(IN_STEP, []) is None
    assert expected_s(IN_STEP, [1.0, 9.0, 2.0]) == 2.0
    # Only the recent steps count: a slow start ages out.
    assert expected_s(IN_STEP, [100.0] * 5 + [1.0] * 20) == 1.0
    # An evaluation or a commit is expected to take what the last one took.
    assert expected_s(EVALUATION, [1.0, 9.0, 2.0]) == 2.0
    assert expected_s(COMMIT, [1.0, 2.0, 9.0]) == 9.0
    assert phase_limit(IN_STEP, [2.0], 30.0).seconds == 34.0
    assert phase_limit(EVALUATION, [], 30.0).seconds == FIRST_LIMIT_S + 30.0
    assert phase_limit(COMMIT, [0.5], 30.0, allowance_s=40.0).seconds == 71.0
    # The run's last checkpoint, written synchronously, is never timed before.
    assert phase_limit(LAST_CHECKPOINT, [0.5], 30.0).seconds == FIRST_LIMIT_S + 30.0
    assert phase_limit(COMMIT, [0.5], 5.0, allowance_s=40.0).describe() == (
        "limit 46.0 s: 2 x 0.50 s expected + 5 s --hang-margin-s + 40.0 s for a checkpoint write"
    )
    assert phase_limit(EVALUATION, [], 5.0).describe() == (
        "limit 545.0 s: 540 s for a first evaluation + 5 s --hang-margin-s"
    )


def test_the_default_margin_is_declared_once_for_every_preset():
    assert {preset["hang_margin_s"] for preset in PRESETS.values()} == {30.0}


def test_a_heartbeat_carries_the_nccl_sequence_numbers_and_one_without_them_decodes_as_before():
    with_numbers = Beat(NOW, 7, IN_STEP, Collectives(enqueued=70, completed=64))
    assert with_numbers.encode() == "1000000.000 7 step 64/70"
    assert Beat.decode(with_numbers.encode()) == with_numbers
    # A gloo rank's, or one of a rank that reads no recorder: unknown, not zero.
    assert Beat.decode("1000000.000 7 between") == Beat(NOW, 7, BETWEEN, None)
    assert Beat(NOW, 7, EVALUATION).encode() == "1000000.000 7 evaluation"


def test_a_stopped_rank_whose_heartbeat_went_stale_in_the_step_did_not_arrive():
    beats = {0: beat(0.1, 7), 1: beat(STALE_S + 1, 7)}
    assert judge(beats, NOW, 7, 2, over=True, limit_s=10.0) == HangJudgement(hung=True, lagging=(1,))
    # Before the step runs past its limit the same heartbeats are no hang yet.
    assert not judge(beats, NOW, 7, 2, over=False, limit_s=10.0).hung


def test_a_rank_gone_longer_than_the_limit_is_a_hang_in_any_phase():
    """This rank writes its checkpoint or waits in a report's barrier, outside the armed step."""
    beats = {0: beat(0.1, 7, BETWEEN), 1: beat(11.0, 7, IN_STEP)}
    assert judge(beats, NOW, 7, 2, over=False, limit_s=10.0) == HangJudgement(hung=True, lagging=(1,))
    assert judge({0: beat(0.1, 7, BETWEEN)}, NOW, 7, 2, over=False, limit_s=10.0).lagging == (1,)


def test_a_live_rank_still_evaluating_or_committing_the_last_step_is_waited_for():
    for phase in (BETWEEN, EVALUATION, COMMIT):
        beats = {0: beat(0.1, 8, IN_STEP), 1: beat(0.1, 7, phase)}
        assert not judge(beats, NOW, 8, 2, over=True, limit_s=10.0).hung


def test_every_rank_alive_inside_the_step_past_its_limit_is_a_deadlock():
    beats = {0: beat(0.1, 8), 1: beat(0.2, 8)}
    assert judge(beats, NOW, 8, 2, over=True, limit_s=10.0) == HangJudgement(hung=True, lagging=())


def test_a_rank_behind_the_step_did_not_arrive():
    beats = {0: beat(0.1, 8), 1: beat(0.1, 6, BETWEEN), 2: beat(0.1, 8)}
    assert judge(beats, NOW, 8, 3, over=True, limit_s=10.0).lagging == (1,)


def test_a_silent_store_names_its_host():
    assert judge(None, NOW, 8, 2, over=True, limit_s=10.0) == HangJudgement(True, (0,), unanswered=True)


def test_the_evaluation_and_the_commit_wait_for_a_rank_still_before_them_and_name_one_behind():
    # Rank 1 still runs step 8 or sits between its phases: the evaluation's all-reduce waits for it.
    for other in (beat(0.1, 8, IN_STEP), beat(0.1, 8, BETWEEN)):
        beats = {0: beat(0.1, 8, EVALUATION), 1: other}
        assert not judge(beats, NOW, 8, 2, over=True, limit_s=9.0, phase=EVALUATION).hung
    # Still evaluating while this rank commits: waited for; already past the commit: arrived.
    evaluating = {0: beat(0.1, 8, COMMIT), 1: beat(0.1, 8, EVALUATION), 2: beat(0.1, 9, IN_STEP)}
    assert not judge(evaluating, NOW, 8, 3, over=True, limit_s=9.0, phase=COMMIT).hung
    assert judge(
        {**evaluating, 1: beat(0.1, 8, COMMIT)}, NOW, 8, 3, over=True, limit_s=9.0, phase=COMMIT
    ).hung
    everyone = {0: beat(0.1, 8, COMMIT), 1: beat(0.1, 8, COMMIT)}
    assert judge(everyone, NOW, 8, 2, over=True, limit_s=9.0, phase=COMMIT) == HangJudgement(True, ())
    behind = {0: beat(0.1, 8, EVALUATION), 1: beat(0.1, 7, IN_STEP)}
    judgement = judge(behind, NOW, 8, 2, over=True, limit_s=9.0, phase=EVALUATION)
    assert judgement == HangJudgement(True, (1,))
    assert not judge(evaluating, NOW, 8, 3, over=False, limit_s=9.0, phase=COMMIT).hung


def test_equal_live_beats_with_one_trailing_completed_collective_name_that_rank():
    """Every rank alive in the step: the NCCL sequence numbers, not the heartbeats, tell."""
    places = {0: Collectives(70, 65), 1: Collectives(70, 64), 2: Collectives(70, 65), 3: Collectives(70, 65)}
    beats = {rank: beat(0.1, 8, IN_STEP, place) for rank, place in places.items()}
    judgement = judge(beats, NOW, 8, 4, over=True, limit_s=10.0)
    assert judgement == HangJudgement(
        True, (1,), detail="last NCCL collective completed #64, the others' #65"
    )
    # Before the limit nothing is judged, and a rank whose numbers are unknown leaves them unused.
    assert not judge(beats, NOW, 8, 4, over=False, limit_s=10.0).hung
    assert judge({**beats, 3: beat(0.1, 8)}, NOW, 8, 4, over=True, limit_s=10.0) == HangJudgement(True, ())


def test_trailing_compares_completed_first_then_enqueued_of_a_rank_with_nothing_pending():
    assert trailing({0: Collectives(70, 64), 1: Collectives(64, 64)}) == (
        (1,),
        "last NCCL collective enqueued #64, the others' #70",
    )
    assert trailing({0: Collectives(70, 64), 1: Collectives(70, 64)}) == ((), None)
    # Rank 1 still waits in #65 and #66 of its own: its stream held its host, which says nothing
    # of which rank the others wait for.
    assert trailing({0: Collectives(70, 64), 1: Collectives(66, 64)}) == ((), None)
    assert trailing({0: Collectives(70, 64), 1: None}) == ((), None)
    assert trailing({}) == ((), None)


def test_the_fixture_is_a_dump_torchs_own_analyzer_reads_and_it_finds_the_rank_the_live_judgement_names(
    capsys,
):
    """torch 2.13's flight recorder analyzer (torch/distributed/flight_recorder) run offline on the
    four ranks' dumps: collective #65 is missing rank 2, the rank the heartbeats name live."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.types import EntryState

    dumps = {rank: dump(rank) for rank in range(WORLD)}
    for rank_dump in dumps.values():
        assert {"version", "comm_lib_version", "pg_config", "pg_status", "entries"} <= set(rank_dump)
        for entry in rank_dump["entries"]:
            EntryState(entry, set(range(WORLD)))  # every field the analyzer reads is there
    details = {
        f"nccl_trace_rank{rank}": {
            "rank": rank,
            **{key: d[key] for key in ("entries", "version", "pg_config")},
        }
        for rank, d in dumps.items()
    }
    options = argparse.Namespace(
        verbose=False, just_print_entries=False, allow_incomplete_ranks=False, mismatch_cap=10
    )
    database = build_db(details, options, dumps[0]["version"])
    first_missing = next(collective for collective in database.collectives if collective.missing_ranks)
    assert (first_missing.collective_seq_id, first_missing.missing_ranks) == (65, {STUCK})

    places = {rank: training_collectives(d, group_id=0) for rank, d in dumps.items()}
    beats = {rank: beat(0.2, 7, IN_STEP, place) for rank, place in places.items()}
    assert judge(beats, NOW, 7, WORLD, over=True, limit_s=40.0).lagging == (STUCK,)


def test_a_dump_with_one_rank_behind_names_that_rank_the_collective_and_its_node():
    places = {rank: training_collectives(dump(rank), group_id=0) for rank in range(WORLD)}
    assert places[0] == Collectives(enqueued=70, completed=64)
    assert places[STUCK] == Collectives(enqueued=64, completed=64)
    assert training_collectives(dump(0), group_id=1) is None  # no such group
    beats = {rank: beat(0.2, 7, IN_STEP, place) for rank, place in places.items()}
    judgement = judge(beats, NOW, 7, WORLD, over=True, limit_s=40.0)
    line = hang_line(
        rank=0,
        step=7,
        waited_s=41.0,
        limit=Limit(IN_STEP, 5.0, 30.0),
        judgement=judgement,
        collective="step_sync (ballot.py:69)",
        recorded=oldest_pending(dump(0)),
    )
    assert line.startswith(
        "hang at step 7: rank(s) 2 did not arrive (last NCCL collective enqueued #64, the others' #70); "
        "rank 0 waits in step_sync (ballot.py:69); oldest pending in the NCCL flight "
        "recorder: nccl:_reduce_scatter_base #65 (scheduled, default_pg) for 41.0 s"
    )
    assert hang_cause({"cause": line, "ranks": list(judgement.lagging)}, HOSTS, 240)[1] == "worker-b"


def test_the_oldest_pending_collective_is_named_not_the_newest():
    entries = dump(0)["entries"]
    assert [entry["collective_seq_id"] for entry in entries if entry["state"] != "completed"] == [
        65,
        66,
        67,
        68,
        69,
        70,
    ]
    shuffled = list(entries)
    random.Random(0).shuffle(shuffled)
    assert oldest_pending({"entries": shuffled}) == "nccl:_reduce_scatter_base #65 (scheduled, default_pg)"
    assert oldest_pending(dump(STUCK)) is None  # every one of its collectives completed
    assert oldest_pending({"version": "2.10"}) is None and oldest_pending(None) is None


def test_the_nccl_recorder_is_read_only_where_it_is_on_and_this_torch_has_it(monkeypatch):
    c10d = torch._C._distributed_c10d
    asked: list[dict[str, bool]] = []

    def fake_dump(**flags: bool) -> bytes:
        asked.append(flags)
        return (FIXTURES / "nccl_trace_rank0.json").read_bytes()

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", fake_dump, raising=False)
    assert read_nccl_recorder(entries=False) is None  # the launcher did not turn it on
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    assert training_collectives(read_nccl_recorder(entries=False), 0) == Collectives(70, 64)
    assert asked == [{"includeCollectives": False, "onlyActive": True}]
    monkeypatch.delattr(c10d, "_dump_nccl_trace_json")
    assert read_nccl_recorder(entries=True) is None  # a build without NCCL (this CPU wheel)


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


def test_the_line_names_the_ranks_the_collective_the_phase_and_the_limit():
    line = hang_line(
        rank=0,
        step=34,
        waited_s=5.5,
        limit=Limit(IN_STEP, 0.16, 5.0),
        judgement=HangJudgement(True, (1,)),
        collective="all_reduce (distributed_c10d.py:3252)",
        recorded=None,
    )
    assert line == (
        "hang at step 34: rank(s) 1 did not arrive; rank 0 waits in all_reduce (distributed_c10d.py:3252) "
        "for 5.5 s (limit 5.3 s: 2 x 0.16 s expected + 5 s --hang-margin-s); ending the attempt to "
        "restart from the latest checkpoint"
    )
    assert "\n" not in line
    assert "store does not answer: rank 0" in hang_line(
        rank=1,
        step=3,
        waited_s=9.0,
        limit=Limit(IN_STEP, None, 5.0),
        judgement=HangJudgement(True, (0,), True),
        collective="x",
        recorded=None,
    )
    commit = hang_line(
        rank=3,
        step=40,
        waited_s=80.0,
        limit=Limit(COMMIT, 2.0, 30.0, 40.0),
        judgement=HangJudgement(True, ()),
        collective="barrier (collective_impl.py:9)",
        recorded=None,
    )
    assert commit.startswith(
        "hang at step 40 in the checkpoint commit: every rank is in the checkpoint commit and alive: a "
        "collective deadlock; rank 3 waits in barrier (collective_impl.py:9) for 80.0 s (limit 74.0 s"
    )


def test_the_attempts_cause_is_the_finding_and_its_node_the_first_rank_that_did_not_arrive():
    """Not the node of the rank that found the hang and exited: a repeated failure on one node is
    judged by this node."""
    note = {
        "cause": "hang at step 24: rank(s) 2, 3 did not arrive; rank 0 waits in all_reduce",
        "ranks": [2, 3],
    }
    hosts = {0: "worker-a", 2: "worker-b", 3: "worker-b"}
    assert hang_cause(note, hosts, 240) == (note["cause"], "worker-b")
    assert hang_cause({**note, "ranks": []}, hosts, 240)[1] is None  # a deadlock: no rank missing
    cut, _ = hang_cause(note, hosts, 20)
    assert len(cut) == 20 and cut.endswith("…")


def test_a_collective_that_raises_after_the_finding_raises_it_and_is_not_timed():
    watchdog = HangWatchdog(0, 1, 30.0, store=None, emit=lambda line: None)
    with pytest.raises(RuntimeError, match="boom"), watchdog.step(1):
        raise RuntimeError("boom")
    watchdog.finding = "hang at step 2: rank(s) 1 did not arrive"
    with pytest.raises(HangError, match=r"^hang at step 2: rank"), watchdog.watch(EVALUATION, 2):
        raise RuntimeError("Connection closed by peer")
    assert watchdog.times[IN_STEP] == [] and watchdog.times[EVALUATION] == []
    with watchdog.watch(COMMIT, 2, allowance_s=3.0):
        assert watchdog._limit(watchdog._watching).seconds == FIRST_LIMIT_S + 30.0 + 3.0
    assert len(watchdog.times[COMMIT]) == 1
    assert watchdog._beat().phase == BETWEEN and watchdog._beat().step == 2


class _Exited(Exception):
    pass


def test_on_nccl_the_rank_exits_after_its_line_and_note_and_never_aborts_the_group(monkeypatch, capfd):
    """No NCCL on this CPU machine: the backend says nccl, the recorder's dump is the fixture."""
    events: list[tuple[str, Any]] = []

    def exit_(code: int) -> None:
        events.append(("exit", code))
        raise _Exited

    def abort(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the process group must not be aborted")

    monkeypatch.setattr(watchdog_module.os, "_exit", exit_)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", abort)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    fixture = (FIXTURES / "nccl_trace_rank0.json").read_bytes()
    monkeypatch.setattr(
        torch._C._distributed_c10d, "_dump_nccl_trace_json", lambda **_: fixture, raising=False
    )

    watchdog = HangWatchdog(
        0,
        WORLD,
        30.0,
        store=None,
        emit=lambda line: events.append(("line", line)),
        on_finding=lambda line, ranks: events.append(("note", ranks)),
    )
    line = watchdog._finding(7, 41.0, Limit(IN_STEP, 5.0, 30.0), HangJudgement(True, (STUCK,)))
    assert "oldest pending in the NCCL flight recorder: nccl:_reduce_scatter_base #65" in line
    with pytest.raises(_Exited):
        watchdog._end(line, (STUCK,))
    assert events == [("line", line), ("note", (STUCK,)), ("exit", HANG_EXIT_CODE)]
    err = capfd.readouterr().err
    assert "Current thread" in err or "Thread 0x" in err  # the stacks, dumped before the note


def test_the_evaluation_and_the_commit_are_judged_against_their_own_limits(monkeypatch):
    """One rank, margin 0.3 s: steps timed at 5 s do not set the evaluation's limit; a first
    evaluation has 540 s, one after an evaluation of 0.01 s has 0.32 s; a commit allowed a write of
    3 s is not judged in 0.6 s."""
    found: list[tuple[str, float]] = []
    watchdog = HangWatchdog.start(0, 1, 0.3, emit=lambda line: None)
    started = time.perf_counter()

    def end(line: str, ranks: tuple[int, ...]) -> None:
        watchdog.finding = line
        found.append((line, time.perf_counter() - started))

    monkeypatch.setattr(watchdog, "_end", end)
    try:
        watchdog.times[IN_STEP].append(5.0)
        with watchdog.watch(EVALUATION, 1):  # the first: 540 s + the margin
            time.sleep(0.4)
        watchdog.times[EVALUATION][:] = [0.01]
        watchdog.times[COMMIT][:] = [0.01]
        with watchdog.watch(COMMIT, 1, allowance_s=3.0):
            time.sleep(0.6)
        assert found == []
        started = time.perf_counter()
        with watchdog.watch(EVALUATION, 2):
            while not found and time.perf_counter() - started < 10.0:
                time.sleep(0.02)
    finally:
        watchdog.stop()
    ((line, after),) = found
    assert line.startswith("hang at step 2 in the evaluation: every rank is in the evaluation and alive")
    assert "(limit 0.3 s: 2 x 0.01 s expected + 0.3 s --hang-margin-s)" in line
    # Judged against this evaluation's limit, not the first one's 540 s: after 0.32 s, and within a
    # bound that holds on a loaded machine (the watchdog's tick is 0.25 s).
    assert 0.32 < after < 10.0


def test_the_heartbeat_names_the_phase_armed():
    watchdog = HangWatchdog(0, 1, 30.0, store=None, emit=lambda line: None)
    watchdog._watching = _Watch(LAST_CHECKPOINT, 80, time.perf_counter(), 0.0)
    assert watchdog._beat().encode().split()[1:] == ["80", "last-checkpoint"]


def _rank(rank: int, port: int, margin_s: float, out: str, stops: int) -> None:
    """Rank `stops` stops itself inside an all_reduce's step; the other's watchdog must name it."""
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
