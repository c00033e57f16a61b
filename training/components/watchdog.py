"""The hang watchdog: a training step far slower than the recent ones is a hang, named and ended.

Each rank runs one thread. The loop arms it around the training step alone (`HangWatchdog.step`),
never around evaluation, checkpoint writes or reports. A step that takes longer than
`hang_limit_s` (2 x the median of this attempt's recent step times, plus --hang-margin-s; before
any step is timed, `FIRST_STEP_LIMIT_S` for the build and compile) is judged against every rank's
heartbeat in the process group's store: a rank whose heartbeat went stale (its process stopped or
gone) or that is behind this step did not arrive. The thread writes one line naming those ranks and
the collective this rank waits in (its training thread's innermost torch.distributed frame, and
the flight recorder's last entry where TORCH_FR_BUFFER_SIZE is set: torch 2.13 records gloo's
collectives too), dumps every thread's stack to stderr, and ends the attempt so the launcher
restarts it from the latest checkpoint, long before the backend's own timeout:

- NCCL: the process group is aborted (`_abort_process_group`, which makes the blocked collective
  raise), and the step raises `HangError` with the line, which Ray Train's failure handling sees
  as the attempt's cause.
- gloo: `ProcessGroupGloo.abort()` returns but leaves a blocked collective waiting (measured on
  torch 2.13.0+cpu: an all_reduce whose peer is asleep stays blocked after it), so the rank exits
  with `HANG_EXIT_CODE` after the line; Ray Train sees a dead worker and restarts.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import torch.distributed as dist

from training.config.settings import HANG_MARGIN_FLAG
from training.errors import RunFailedError

# The watchdog's tick: how often a rank publishes its heartbeat and checks its own step.
TICK_S = 0.25
# How often a rank reads every rank's heartbeat while its step is within its limit (every tick
# once past it): one multi-key read a second per rank keeps the store's load small at scale.
CHECK_EVERY_S = 1.0
# A heartbeat older than this belongs to a rank whose process is stopped or gone.
STALE_S = 3.0
# Step times the expected one is the median of.
RECENT_STEPS = 20
# The limit of an attempt's first step, which builds, loads and compiles: generous, and still
# below NCCL's 10-minute default timeout and Ray Train's 30-minute process-group timeout.
FIRST_STEP_LIMIT_S = 540.0
# How long a rank waits for the store to answer before naming its host (rank 0) as not answering.
STORE_TIMEOUT_S = 2.0
# How long the finding's note (`on_finding`) may take before the attempt ends without it.
NOTE_TIMEOUT_S = 10.0
# A gloo rank that found a hang exits with this (EX_TEMPFAIL: try again), after its line.
HANG_EXIT_CODE = 75
KEY_PREFIX = "hang-watchdog/"
# The finding a launcher keeps for its restart's record (`HangWatchdog.on_finding`): under gloo the
# rank that found the hang exits, and the record would otherwise blame that rank's node.
HANG_NOTE_FILE = "hang.json"
IN_STEP, BETWEEN = "step", "between"


class _Silent(Exception):
    """The store did not answer."""


class HangError(RunFailedError):
    """A step found hung; its message is the one-line finding."""


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat: when it last ticked (wall time), its step and whether it is inside it."""

    time: float
    step: int
    phase: str

    def encode(self) -> str:
        return f"{self.time:.3f} {self.step} {self.phase}"

    @staticmethod
    def decode(text: str) -> Beat:
        when, step, phase = text.split()
        return Beat(float(when), int(step), phase)


def expected_step_s(recent: Sequence[float]) -> float | None:
    """The step time a healthy step takes: the median of the recent ones; None before any."""
    return statistics.median(recent[-RECENT_STEPS:]) if recent else None


def hang_limit_s(expected: float | None, margin_s: float) -> float:
    """How long a step may take before it counts as hung."""
    return (FIRST_STEP_LIMIT_S if expected is None else 2 * expected) + margin_s


@dataclass(frozen=True)
class Verdict:
    """`hung`: no rank is still busy outside the step; `lagging`: the ranks that did not arrive."""

    hung: bool
    lagging: tuple[int, ...]
    unanswered: bool = False


def judge(
    beats: dict[int, Beat] | None, now: float, step: int, world_size: int, *, step_over: bool, limit_s: float
) -> Verdict:
    """Judge every rank's heartbeat (None: the store, which rank 0 hosts, does not answer; the
    caller asks only once it has been silent for `limit_s` or a step ran past it). In any phase, a
    rank whose heartbeat is older than `limit_s` is stopped or gone: a hang, even while this rank
    writes a checkpoint or reports (which wait for it too). A step past its limit (`step_over`) is
    also a hang when a rank's heartbeat is merely stale or behind the step, or when every rank is
    inside it; not while a fresh rank is still outside it (writing its checkpoint, evaluating): the
    step waits for that rank."""
    if beats is None:
        return Verdict(hung=True, lagging=(0,), unanswered=True)
    gone = tuple(rank for rank in range(world_size) if rank not in beats or now - beats[rank].time > limit_s)
    if gone or not step_over:
        return Verdict(hung=bool(gone), lagging=gone)
    lagging, busy = [], False
    for rank in range(world_size):
        beat = beats[rank]
        if now - beat.time > STALE_S:
            lagging.append(rank)
        elif beat.phase == BETWEEN and beat.step >= step - 1:
            busy = busy or beat.step < step
        elif beat.step < step:
            lagging.append(rank)
    return Verdict(hung=bool(lagging) or not busy, lagging=tuple(lagging))


def waiting_collective(frames: Sequence[tuple[str, str, int]]) -> str:
    """The collective a thread waits in, from its stack (outermost first: file, function, line):
    its innermost frame in torch.distributed's c10d module, else in torch.distributed, else in
    Ray Train (a report's barrier), else its innermost frame."""
    distributed = [frame for frame in frames if f"torch{os.sep}distributed{os.sep}" in frame[0]]
    c10d = [frame for frame in distributed if frame[0].endswith("distributed_c10d.py")]
    ray_train = [frame for frame in frames if f"ray{os.sep}train{os.sep}" in frame[0]]
    chosen = (c10d or distributed or ray_train or list(frames))[-1:]
    if not chosen:
        return "an unknown frame"
    file, function, line = chosen[0]
    return f"{function} ({os.path.basename(file)}:{line})"


def last_recorded_collective(dump: str | None) -> str | None:
    """The flight recorder's last entry (`_dump_fr_trace_json`'s JSON) as `name #sequence`."""
    if not dump:
        return None
    entries = json.loads(dump).get("entries") or []
    if not entries:
        return None
    last = entries[-1]
    return f"{last.get('profiling_name', '?')} #{last.get('collective_seq_id', '?')}"


def hang_line(
    *,
    rank: int,
    step: int,
    waited_s: float,
    expected_s: float | None,
    margin_s: float,
    verdict: Verdict,
    collective: str,
    recorded: str | None,
) -> str:
    """The one-line finding."""
    if verdict.unanswered:
        who = (
            "the process group's store does not answer: rank 0 (its host under Ray Train) is stopped or gone"
        )
    elif verdict.lagging:
        who = f"rank(s) {', '.join(map(str, verdict.lagging))} did not arrive"
    else:
        who = "every rank is in the step and alive: a collective deadlock"
    expected = "the first step's" if expected_s is None else f"2 x {expected_s:.2f} s expected"
    recorder = f"; flight recorder's last: {recorded}" if recorded else ""
    return (
        f"hang at step {step}: {who}; rank {rank} waits in {collective}{recorder} for "
        f"{waited_s:.1f} s (limit {hang_limit_s(expected_s, margin_s):.1f} s: {expected} + "
        f"{margin_s:g} s {HANG_MARGIN_FLAG}); ending the attempt to restart from the latest checkpoint"
    )


def hang_cause(note: dict[str, Any], hosts: dict[int, str], limit: int) -> tuple[str, str | None]:
    """The attempt's cause and node from a hang's note ({"cause": line, "ranks": lagging}): the
    finding (cut to `limit` characters) and the host of the first rank that did not arrive."""
    line, ranks = str(note["cause"]), list(note.get("ranks") or [])
    cause = line if len(line) <= limit else line[: limit - 1] + "…"
    return cause, (hosts.get(int(ranks[0])) if ranks else None)


def _stack(frame: FrameType | None) -> list[tuple[str, str, int]]:
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_code.co_name, frame.f_lineno))
        frame = frame.f_back
    return frames[::-1]


def _flight_recorder_dump() -> str | None:
    if not (os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")):
        return None
    try:
        dump: str = dist.distributed_c10d._C._distributed_c10d._dump_fr_trace_json(True, True)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return None
    return dump


class HangWatchdog:
    """One rank's watchdog thread (`start`); `step` arms it around a training step."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        margin_s: float,
        store: Any,
        emit: Callable[[str], None],
        on_finding: Callable[[str, tuple[int, ...]], None] | None = None,
    ) -> None:
        """`on_finding(line, ranks)`: where the launcher keeps the finding (Ray: `HANG_NOTE_FILE`)."""
        self.rank, self.world_size, self.margin_s = rank, world_size, margin_s
        self.store, self.emit, self.on_finding = store, emit, on_finding
        self.step_times: list[float] = []
        self.current = Beat(time.time(), 0, BETWEEN)
        self.step_started: float | None = None
        self.training_thread = threading.get_ident()
        self.finding: str | None = None
        self._stuck: threading.Thread | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    @classmethod
    def start(
        cls,
        rank: int,
        world_size: int,
        margin_s: float,
        emit: Callable[[str], None],
        on_finding: Callable[[str, tuple[int, ...]], None] | None = None,
    ) -> HangWatchdog:
        """A watchdog with its own client of the process group's store (MASTER_ADDR/MASTER_PORT,
        which torchrun and Ray Train's env:// set-up export), so a store call that waits on a
        stopped host never holds the process group's own client."""
        store = None
        if world_size > 1 and "MASTER_ADDR" in os.environ:
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
        watchdog = cls(rank, world_size, margin_s, store, emit, on_finding)
        watchdog._publish()  # before any rank reads it
        watchdog._thread.start()
        return watchdog

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Arm around training step `step`; a collective that raises after an abort the watchdog
        made raises `HangError` with its finding instead."""
        self.training_thread = threading.get_ident()
        self.current = Beat(time.time(), step, IN_STEP)
        self.step_started = time.perf_counter()
        try:
            yield
        except Exception as error:
            if self.finding is not None:
                raise HangError(self.finding) from error
            raise
        finally:
            elapsed = time.perf_counter() - self.step_started
            self.step_started = None
            self.current = Beat(time.time(), step, BETWEEN)
        self.step_times.append(elapsed)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * TICK_S + STORE_TIMEOUT_S)

    def _store_call(self, call: Callable[[], Any]) -> Any:
        """`call` on the store, or `_Silent` when it fails or takes longer than STORE_TIMEOUT_S. A
        client blocks on a stopped host past its own timeout (measured on torch 2.13: a TCPStore
        whose server process is SIGSTOPped), so the call runs in a thread of its own; while one is
        stuck, no other is made."""
        if self._stuck is not None and self._stuck.is_alive():
            raise _Silent
        answer: dict[str, Any] = {}

        def run() -> None:
            with contextlib.suppress(RuntimeError):  # torch's DistStoreError
                answer["value"] = call()

        thread = threading.Thread(target=run, name="hang-watchdog-store", daemon=True)
        thread.start()
        thread.join(STORE_TIMEOUT_S)
        if thread.is_alive():
            self._stuck = thread
        if "value" not in answer:
            raise _Silent
        return answer["value"]

    def _publish(self) -> None:
        if self.store is None:
            return
        store, key = self.store, f"{KEY_PREFIX}{self.rank}"
        beat = Beat(time.time(), self.current.step, self.current.phase).encode()
        with contextlib.suppress(_Silent):
            self._store_call(lambda: store.set(key, beat))

    def _beats(self) -> dict[int, Beat] | None:
        if self.store is None:
            return {self.rank: Beat(time.time(), self.current.step, self.current.phase)}
        store, keys = self.store, [f"{KEY_PREFIX}{rank}" for rank in range(self.world_size)]
        try:
            values = self._store_call(lambda: store.multi_get(keys))
        except _Silent:
            return None
        return {rank: Beat.decode(value.decode()) for rank, value in enumerate(values)}

    def _run(self) -> None:
        store_answered = checked = time.monotonic()
        while not self._stopped.wait(TICK_S):
            self._publish()
            if self.finding is not None:
                continue
            expected = expected_step_s(self.step_times)
            limit = hang_limit_s(expected, self.margin_s)
            started = self.step_started
            in_step = 0.0 if started is None else time.perf_counter() - started
            if in_step <= limit and time.monotonic() - checked < CHECK_EVERY_S:
                continue
            checked = time.monotonic()
            beats = self._beats()
            if beats is not None:
                store_answered = time.monotonic()
            elif time.monotonic() - store_answered <= limit and in_step <= limit:
                continue
            now = time.time()
            verdict = judge(
                beats, now, self.current.step, self.world_size, step_over=in_step > limit, limit_s=limit
            )
            if verdict.hung:
                ages = [now - beats[rank].time for rank in verdict.lagging if beats and rank in beats]
                waited = max([in_step, time.monotonic() - store_answered, *ages])
                self._end(self._finding(waited, expected, verdict), verdict.lagging)

    def _finding(self, waited: float, expected: float | None, verdict: Verdict) -> str:
        frame = sys._current_frames().get(self.training_thread)
        return hang_line(
            rank=self.rank,
            step=self.current.step,
            waited_s=waited,
            expected_s=expected,
            margin_s=self.margin_s,
            verdict=verdict,
            collective=waiting_collective(_stack(frame)),
            recorded=last_recorded_collective(_flight_recorder_dump()),
        )

    def _end(self, finding: str, lagging: tuple[int, ...]) -> None:
        self.finding = finding
        self.emit(finding)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        if self.on_finding is not None:
            # Bounded: storage that does not answer must not hold the attempt's end.
            note = threading.Thread(target=self.on_finding, args=(finding, lagging), daemon=True)
            note.start()
            note.join(NOTE_TIMEOUT_S)
        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
            return
        sys.stdout.flush()
        os._exit(HANG_EXIT_CODE)
