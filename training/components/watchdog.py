"""The hang watchdog: a phase of a training step far slower than the recent ones is a hang, named
and ended.

Each rank runs one thread. The loop arms it around three phases, each with its own limit
(`phase_limit`): the training step (`HangWatchdog.step`: 2 x the median of the attempt's recent
step times, plus --hang-margin-s), and, through `HangWatchdog.watch`, the evaluation and the
report that commits checkpoints (2 x the last one's time plus the margin; the commit's limit also
allows one checkpoint write, which it may wait for). Before a phase has been timed in the attempt
its limit is `FIRST_LIMIT_S` plus the margin (the first step builds, loads and compiles); the
run's last checkpoint, written synchronously, always has that limit.

A phase past its limit is judged (`judge`) against every rank's heartbeat in the process group's
store: a rank whose heartbeat went stale (its process stopped or gone) or that is behind this
phase did not arrive. Where every rank is alive and inside the phase, the heartbeats' NCCL
sequence numbers name the rank that did not arrive: on NCCL, each heartbeat carries the training
group's last enqueued and last completed collective (ProcessGroupNCCL's own counters, read from
its flight recorder once a second: `training_collectives`), and a rank whose numbers trail the
others' is the one the others wait for; the flight recorder's cross-rank analysis, done live.

The thread then writes one line naming those ranks, the collective this rank waits in (its
training thread's innermost torch.distributed frame) and, on NCCL, the flight recorder's oldest
collective not completed (`oldest_pending`), dumps every thread's stack to stderr, has the
launcher keep the finding (`on_finding`), and exits the process with `HANG_EXIT_CODE`, on every
backend: Ray Train sees a dead worker and restarts the attempt from the latest checkpoint, long
before the backend's own timeout. It never aborts the process group: torch documents
`_abort_process_group` for use with TORCH_NCCL_ASYNC_ERROR_HANDLING=0 (torch 2.13:
torch/distributed/distributed_c10d.py), which Ray Train sets to 1, and a CUDA sync that an abort
releases can return on buffers the aborted collectives never filled, on which the step would run on.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from training.config.settings import HANG_MARGIN_FLAG
from training.errors import RunFailedError

# The watchdog's tick: how often a rank publishes its heartbeat and checks its own phase.
TICK_S = 0.25
# How often a rank reads every rank's heartbeat while its phase is within its limit (every tick
# once past it), and its own NCCL sequence numbers: one multi-key read a second per rank keeps the
# store's load small at scale.
CHECK_EVERY_S = 1.0
# A heartbeat older than this belongs to a rank whose process is stopped or gone.
STALE_S = 3.0
# Step times the expected one is the median of.
RECENT_STEPS = 20
# The limit of a phase the attempt has not timed yet (its first step builds, loads and compiles):
# generous, and still below NCCL's 10-minute default timeout and Ray Train's 30-minute
# process-group timeout.
FIRST_LIMIT_S = 540.0
# How long a rank waits for the store to answer before naming its host (rank 0) as not answering.
STORE_TIMEOUT_S = 2.0
# How long the finding's note (`on_finding`) may take before the rank exits without it.
NOTE_TIMEOUT_S = 10.0
# A rank that found a hang exits with this (EX_TEMPFAIL: try again), after its line.
HANG_EXIT_CODE = 75
KEY_PREFIX = "hang-watchdog/"
# The finding a launcher keeps for its restart's record (`HangWatchdog.on_finding`): the rank
# that found the hang exits, and the record would otherwise blame that rank's node.
HANG_NOTE_FILE = "hang.json"
# The phases a heartbeat names (one word each: the heartbeat is space-separated).
IN_STEP, EVALUATION, COMMIT, LAST_CHECKPOINT, BETWEEN = (
    "step",
    "evaluation",
    "commit",
    "last-checkpoint",
    "between",
)
# A step's watched phases in the order the loop runs them.
_ORDER = {IN_STEP: 0, EVALUATION: 1, COMMIT: 2, LAST_CHECKPOINT: 2}
_NAMES = {
    IN_STEP: "step",
    EVALUATION: "evaluation",
    COMMIT: "checkpoint commit",
    LAST_CHECKPOINT: "last checkpoint",
}
# The flight recorder's ring buffer size (entries); 0 turns it off. The watchdog reads the NCCL
# recorder only where the launcher set one (the Ray launcher sets 2000).
FR_BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


class _Silent(Exception):
    """The store did not answer."""


class HangError(RunFailedError):
    """A collective that raised in a watched phase after the watchdog found a hang (a peer's
    connection closed while the rank writes its note, before it exits); its message is the
    finding."""


@dataclass(frozen=True)
class Collectives:
    """A rank's place in the training process group's NCCL collectives: the sequence number of
    the last it enqueued and of the last that completed (ProcessGroupNCCL's `ProcessGroupStatus`,
    -1 before any)."""

    enqueued: int
    completed: int

    def encode(self) -> str:
        return f"{self.completed}/{self.enqueued}"

    @staticmethod
    def decode(text: str) -> Collectives:
        completed, enqueued = text.split("/")
        return Collectives(enqueued=int(enqueued), completed=int(completed))


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat: when it last ticked (wall time), its step, the phase it is in
    (`BETWEEN` outside the watched ones) and, on NCCL, its place in the training group's
    collectives (None: unknown)."""

    time: float
    step: int
    phase: str
    collectives: Collectives | None = None

    def encode(self) -> str:
        text = f"{self.time:.3f} {self.step} {self.phase}"
        return text if self.collectives is None else f"{text} {self.collectives.encode()}"

    @staticmethod
    def decode(text: str) -> Beat:
        """A heartbeat without sequence numbers (a gloo rank, or one that reads no recorder)
        leaves them unknown."""
        when, step, phase, *rest = text.split()
        return Beat(float(when), int(step), phase, Collectives.decode(rest[0]) if rest else None)


def expected_s(phase: str, times: Sequence[float]) -> float | None:
    """The time a healthy `phase` takes: for the step, the median of the recent ones; for the
    others, the last one's; None before any."""
    if not times:
        return None
    return statistics.median(times[-RECENT_STEPS:]) if phase == IN_STEP else times[-1]


@dataclass(frozen=True)
class Limit:
    """How long a phase may take before it counts as hung, and what the limit is made of."""

    phase: str
    expected_s: float | None  # None: the attempt has not timed this phase yet
    margin_s: float
    allowance_s: float = 0.0  # a commit's: the checkpoint write it may wait for

    @property
    def seconds(self) -> float:
        base = FIRST_LIMIT_S if self.expected_s is None else 2 * self.expected_s
        return base + self.margin_s + self.allowance_s

    def describe(self) -> str:
        if self.phase == LAST_CHECKPOINT:
            base = f"{FIRST_LIMIT_S:g} s for the last checkpoint"
        elif self.expected_s is None:
            base = f"{FIRST_LIMIT_S:g} s for a first {_NAMES.get(self.phase, self.phase)}"
        else:
            base = f"2 x {self.expected_s:.2f} s expected"
        allowance = f" + {self.allowance_s:.1f} s for a checkpoint write" if self.allowance_s else ""
        return f"limit {self.seconds:.1f} s: {base} + {self.margin_s:g} s {HANG_MARGIN_FLAG}{allowance}"


def phase_limit(phase: str, times: Sequence[float], margin_s: float, allowance_s: float = 0.0) -> Limit:
    """The limit of `phase` given its times in this attempt; the last checkpoint's is never timed."""
    return Limit(phase, None if phase == LAST_CHECKPOINT else expected_s(phase, times), margin_s, allowance_s)


@dataclass(frozen=True)
class HangJudgement:
    """`hung`: no rank is still busy before this phase; `lagging`: the ranks that did not arrive;
    `detail`: how the NCCL sequence numbers named them."""

    hung: bool
    lagging: tuple[int, ...]
    unanswered: bool = False
    detail: str | None = None


def trailing(collectives: Mapping[int, Collectives | None]) -> tuple[tuple[int, ...], str | None]:
    """The ranks whose NCCL sequence numbers trail the others' (every rank's known; none where
    they agree), and how. First the last completed collective: a rank still in one the others
    finished. Then, where those agree, the last enqueued: a rank that never issued the
    collectives the others wait in, everything it did issue completed (the flight recorder
    analyzer's "not all ranks joining collective"). A rank behind in enqueued ones that still
    waits in collectives of its own is not named: its host was held by its stream (a full launch
    queue behind a wedged kernel can hold a healthy rank's too), and the numbers cannot tell."""
    if not collectives or any(place is None for place in collectives.values()):
        return (), None
    known = {rank: place for rank, place in collectives.items() if place is not None}
    for what in ("completed", "enqueued"):
        numbers = {rank: getattr(place, what) for rank, place in known.items()}
        low, high = min(numbers.values()), max(numbers.values())
        if low < high:
            behind = [rank for rank, number in numbers.items() if number == low]
            if what == "enqueued" and any(known[rank].completed < low for rank in behind):
                return (), None
            return tuple(sorted(behind)), f"last NCCL collective {what} #{low}, the others' #{high}"
    return (), None


def _waited_for(beat: Beat, step: int, phase: str) -> bool:
    """Whether a live rank is still doing what comes before this rank's `phase` of `step` (the
    step before's evaluation or commit, an earlier phase of this step): this phase waits for it,
    and its own watchdog judges it."""
    if phase == IN_STEP:
        return beat.step == step - 1 and beat.phase != IN_STEP
    return beat.step == step and (beat.phase == BETWEEN or _ORDER.get(beat.phase, 0) < _ORDER.get(phase, 0))


def judge(
    beats: dict[int, Beat] | None,
    now: float,
    step: int,
    world_size: int,
    *,
    over: bool,
    limit_s: float,
    phase: str = IN_STEP,
) -> HangJudgement:
    """Judge every rank's heartbeat from this rank's `phase` of `step` (None: the store, which
    rank 0 hosts, does not answer; the caller asks only once it has been silent for `limit_s` or
    the phase ran past it). In any phase, a rank whose heartbeat is older than `limit_s` is
    stopped or gone: a hang, even while this rank is between phases (they wait for it too). A
    phase past its limit (`over`) is also a hang when a rank's heartbeat is merely stale or
    behind it, or when every rank is in it or past it; not while a live rank is still before it
    (`_waited_for`). Where every rank is in it, the ranks whose NCCL sequence numbers trail the
    others' are the ones that did not arrive (`trailing`)."""
    if beats is None:
        return HangJudgement(hung=True, lagging=(0,), unanswered=True)
    gone = tuple(rank for rank in range(world_size) if rank not in beats or now - beats[rank].time > limit_s)
    if gone or not over:
        return HangJudgement(hung=bool(gone), lagging=gone)
    lagging, busy = [], False
    for rank in range(world_size):
        beat = beats[rank]
        if now - beat.time > STALE_S:
            lagging.append(rank)
        elif _waited_for(beat, step, phase):
            busy = True
        elif beat.step < step:
            lagging.append(rank)
    if lagging or busy:
        return HangJudgement(hung=bool(lagging), lagging=tuple(lagging))
    named, detail = trailing({rank: beats[rank].collectives for rank in range(world_size)})
    return HangJudgement(hung=True, lagging=named, detail=detail)


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


# The NCCL flight recorder's JSON, as torch 2.13 writes it (FlightRecorder<EventType>::dump_json;
# its fields are the constants of torch/csrc/distributed/c10d/FlightRecorder.hpp in the wheel's
# include/ tree, and its analyzer reads them in torch/distributed/flight_recorder/components/
# types.py, `EntryState` and `Op`): top-level "version", "comm_lib_version", "pg_config",
# "pg_status" (per pg_id, ProcessGroupNCCL's last enqueued, started and completed collective, as
# strings; torch/csrc/distributed/c10d/logger.hpp, `ProcessGroupStatus`) and "entries", one per
# collective in the order recorded: "record_id", "pg_id", "process_group" ([name, desc]),
# "collective_seq_id", "p2p_seq_id", "profiling_name" ("nccl:all_reduce"), "state" ("scheduled",
# "started" or "completed"), "retired", "time_discovered_started_ns", ... (no "frames": the JSON
# dump leaves stack traces out).


def training_collectives(dump: Mapping[str, Any] | None, group_id: int) -> Collectives | None:
    """The training group's (`group_id`, its ProcessGroupNCCL's uid) last enqueued and completed
    collective from a recorder dump's "pg_status"; None where the dump has none."""
    status = ((dump or {}).get("pg_status") or {}).get(str(group_id))
    if not status:
        return None
    try:
        return Collectives(
            enqueued=int(status["last_enqueued_collective"]),
            completed=int(status["last_completed_collective"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def oldest_pending(dump: Mapping[str, Any] | None) -> str | None:
    """The oldest collective a recorder dump holds that has not completed (the one the rank's
    stream is blocked in; those after it wait behind it) as `name #sequence (state, group)`; None
    where every one completed."""
    entries = (dump or {}).get("entries") or []
    pending = [
        entry for entry in entries if entry.get("state") != "completed" and not entry.get("retired", False)
    ]
    if not pending:
        return None
    entry = min(pending, key=lambda entry: int(entry.get("record_id", 0)))
    group = (entry.get("process_group") or ["?", "?"])[-1]
    name, number = entry.get("profiling_name", "?"), entry.get("collective_seq_id", "?")
    return f"{name} #{number} ({entry.get('state', '?')}, {group})"


def _recorder_on() -> bool:
    sizes = [os.environ.get(name, "").strip() for name in FR_BUFFER_ENV]
    return any(size.isdigit() and int(size) > 0 for size in sizes)


def read_nccl_recorder(*, entries: bool) -> dict[str, Any] | None:
    """This process's NCCL flight recorder (`_dump_nccl_trace_json`, in NCCL builds of torch:
    ProcessGroupNCCL records there, not in the gloo/CPU recorder `_dump_fr_trace_json` reads):
    with `entries`, its collectives not completed, whose CUDA events the dump queries; without,
    only its process groups' config and status, a dump of a few hundred bytes that touches no
    entry, cheap enough to make every second. None where the recorder is off (`FR_BUFFER_ENV`)
    or this torch has none."""
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace_json", None)
    if dump is None or not _recorder_on():
        return None
    try:
        parsed = json.loads(dump(includeCollectives=entries, onlyActive=True))
    except (RuntimeError, TypeError, ValueError):
        return None
    return parsed if isinstance(parsed, dict) else None


def training_group_id() -> int | None:
    """The uid of the default process group's NCCL backend (ProcessGroupNCCL's `local_id_`, the
    pg_id its recorder entries and status carry), or None without one."""
    try:
        backend: Any = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
        return int(backend.uid)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def _collectives_reader(group_id: int) -> Callable[[], Collectives | None]:
    """Reads this rank's place in the training group's collectives from the NCCL recorder."""
    return lambda: training_collectives(read_nccl_recorder(entries=False), group_id)


def hang_line(
    *,
    rank: int,
    step: int,
    waited_s: float,
    limit: Limit,
    judgement: HangJudgement,
    collective: str,
    recorded: str | None,
) -> str:
    """The one-line finding."""
    what = _NAMES.get(limit.phase, limit.phase)
    if judgement.unanswered:
        who = (
            "the process group's store does not answer: rank 0 (its host under Ray Train) is stopped or gone"
        )
    elif judgement.lagging:
        detail = f" ({judgement.detail})" if judgement.detail else ""
        who = f"rank(s) {', '.join(map(str, judgement.lagging))} did not arrive{detail}"
    else:
        who = f"every rank is in the {what} and alive: a collective deadlock"
    where = "" if limit.phase == IN_STEP else f" in the {what}"
    recorder = f"; oldest pending in the NCCL flight recorder: {recorded}" if recorded else ""
    return (
        f"hang at step {step}{where}: {who}; rank {rank} waits in {collective}{recorder} for "
        f"{waited_s:.1f} s ({limit.describe()}); ending the attempt to restart from the latest checkpoint"
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


@dataclass(frozen=True)
class _Watch:
    phase: str
    step: int
    started: float  # perf_counter
    allowance_s: float


class HangWatchdog:
    """One rank's watchdog thread (`start`); `watch` (and `step`) arms it around a phase."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        margin_s: float,
        store: Any,
        emit: Callable[[str], None],
        on_finding: Callable[[str, tuple[int, ...]], None] | None = None,
        read_collectives: Callable[[], Collectives | None] | None = None,
    ) -> None:
        """`on_finding(line, ranks)`: where the launcher keeps the finding (Ray: `HANG_NOTE_FILE`);
        `read_collectives`: this rank's NCCL sequence numbers, read at most once per
        CHECK_EVERY_S (None: the heartbeat carries none)."""
        self.rank, self.world_size, self.margin_s = rank, world_size, margin_s
        self.store, self.emit, self.on_finding = store, emit, on_finding
        self.read_collectives = read_collectives
        self.collectives: Collectives | None = None
        # Each watched phase's times in this attempt, the recent ones (appended by the training
        # thread, copied whole by the watchdog's).
        self.times: dict[str, list[float]] = {phase: [] for phase in _ORDER}
        self._watching: _Watch | None = None
        self._step = 0  # the last step armed
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
        stopped host never holds the process group's own client. On NCCL with the flight recorder
        on, its heartbeat carries the training group's sequence numbers."""
        store = None
        if world_size > 1 and "MASTER_ADDR" in os.environ:
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
            )
        nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        group_id = training_group_id() if nccl and _recorder_on() else None
        reader = None if group_id is None else _collectives_reader(group_id)
        watchdog = cls(rank, world_size, margin_s, store, emit, on_finding, reader)
        watchdog._publish()  # before any rank reads it
        watchdog._thread.start()
        return watchdog

    @contextlib.contextmanager
    def watch(self, phase: str, step: int, *, allowance_s: float = 0.0) -> Iterator[None]:
        """Arm around `phase` (IN_STEP, EVALUATION, COMMIT or LAST_CHECKPOINT) of step `step`,
        judged against its own limit plus `allowance_s` (a commit's: a checkpoint write it may
        wait for); a collective that raises after the watchdog's finding raises `HangError` with
        it instead. A phase that raised is not timed."""
        self.training_thread = threading.get_ident()
        watching = _Watch(phase, step, time.perf_counter(), allowance_s)
        self._watching = watching
        try:
            yield
        except Exception as error:
            if self.finding is not None:
                raise HangError(self.finding) from error
            raise
        finally:
            elapsed = time.perf_counter() - watching.started
            self._step = step  # first: the heartbeat goes from this phase to after it, never back
            self._watching = None
        times = self.times[phase]
        times.append(elapsed)
        del times[:-RECENT_STEPS]

    def step(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Arm around training step `step`."""
        return self.watch(IN_STEP, step)

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

    def _beat(self) -> Beat:
        watching = self._watching
        if watching is None:
            return Beat(time.time(), self._step, BETWEEN, self.collectives)
        return Beat(time.time(), watching.step, watching.phase, self.collectives)

    def _publish(self) -> None:
        if self.store is None:
            return
        store, key, beat = self.store, f"{KEY_PREFIX}{self.rank}", self._beat().encode()
        with contextlib.suppress(_Silent):
            self._store_call(lambda: store.set(key, beat))

    def _beats(self) -> dict[int, Beat] | None:
        if self.store is None:
            return {self.rank: self._beat()}
        store, keys = self.store, [f"{KEY_PREFIX}{rank}" for rank in range(self.world_size)]
        try:
            values = self._store_call(lambda: store.multi_get(keys))
        except _Silent:
            return None
        return {rank: Beat.decode(value.decode()) for rank, value in enumerate(values)}

    def _limit(self, watching: _Watch | None) -> Limit:
        """The armed phase's limit; between phases, the step's (a rank gone that long is a hang)."""
        if watching is None:
            return phase_limit(IN_STEP, list(self.times[IN_STEP]), self.margin_s)
        times = list(self.times[watching.phase])
        return phase_limit(watching.phase, times, self.margin_s, watching.allowance_s)

    def _run(self) -> None:
        store_answered = checked = time.monotonic()
        read = checked - CHECK_EVERY_S  # the NCCL sequence numbers: read at the first tick
        while not self._stopped.wait(TICK_S):
            if self.read_collectives is not None and time.monotonic() - read >= CHECK_EVERY_S:
                read = time.monotonic()
                self.collectives = self.read_collectives()
            self._publish()
            if self.finding is not None:
                continue
            watching = self._watching
            limit = self._limit(watching)
            in_phase = 0.0 if watching is None else time.perf_counter() - watching.started
            over = in_phase > limit.seconds
            if not over and time.monotonic() - checked < CHECK_EVERY_S:
                continue
            checked = time.monotonic()
            beats = self._beats()
            if beats is not None:
                store_answered = time.monotonic()
            elif time.monotonic() - store_answered <= limit.seconds and not over:
                continue
            now = time.time()
            # Between phases only a rank gone longer than the step's limit is judged (`over` is False).
            phase, step = (IN_STEP, self._step) if watching is None else (watching.phase, watching.step)
            judgement = judge(
                beats, now, step, self.world_size, over=over, limit_s=limit.seconds, phase=phase
            )
            if judgement.hung:
                ages = [now - beats[rank].time for rank in judgement.lagging if beats and rank in beats]
                waited = max([in_phase, time.monotonic() - store_answered, *ages])
                self._end(self._finding(step, waited, limit, judgement), judgement.lagging)

    def _finding(self, step: int, waited: float, limit: Limit, judgement: HangJudgement) -> str:
        frame = sys._current_frames().get(self.training_thread)
        nccl = dist.is_initialized() and dist.get_backend() == "nccl"
        return hang_line(
            rank=self.rank,
            step=step,
            waited_s=waited,
            limit=limit,
            judgement=judgement,
            collective=waiting_collective(_stack(frame)),
            recorded=oldest_pending(read_nccl_recorder(entries=True)) if nccl else None,
        )

    def _end(self, finding: str, lagging: tuple[int, ...]) -> None:
        """The line, every thread's stack, the launcher's note (bounded), then the process's exit
        with HANG_EXIT_CODE, on every backend: a blocked collective is never released under the
        training thread (gloo's abort leaves it blocked, measured on torch 2.13.0+cpu; after NCCL's
        it can return on buffers never filled)."""
        self.finding = finding
        self.emit(finding)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        if self.on_finding is not None:
            # Bounded: storage that does not answer must not hold the attempt's end.
            note = threading.Thread(target=self.on_finding, args=(finding, lagging), daemon=True)
            note.start()
            note.join(NOTE_TIMEOUT_S)
        sys.stdout.flush()
        os._exit(HANG_EXIT_CODE)
