"""Checkpoints written behind the next steps, and the time-based cadence that places them.

A periodic checkpoint stages the model and optimizer state to CPU memory (the step's only stall)
and `torch.distributed.checkpoint.async_save` writes it from a thread over a gloo process group of
its own, so the writer's collectives never interleave with training's on the default group
(torch 2.13: torch/distributed/checkpoint/state_dict_saver.py, which asks for a CPU backend),
straight to the checkpoint's location in the run's storage (`training.components.storage`). The
checkpoint is committed, rank 0's `train_state.json` written (`is_complete` keys on it) and the
folder published through the session, only at a step boundary where every rank's write has
finished: each rank's "written" count rides on the step's all-reduce (a slot of its ballot,
`training.distributed.ballot`), so all ranks commit at the same step. Only a whole checkpoint is committed: every rank's write succeeded and
every file its DCP metadata names is in storage at its size, agreed by all ranks; one that is not
is dropped with a line, and the run trains on. One write is in flight at a time; the run's last
checkpoint waits for it and is written synchronously.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.optim import Optimizer

from training.components import storage
from training.components.checkpoint import CHECKPOINT_SCORE, write_error, write_train_state
from training.config import drain_budget
from training.config.deadline_margin import CHECKPOINT_BYTES_PER_PARAMETER
from training.config.drain_budget import DrainChoice, drain_choice
from training.distributed.ballot import StepBallot

# The share of the run's time checkpoints may take from training: a time-based checkpoint is
# written no more often than one checkpoint's measured cost (`write_cost_s`) divided by this.
MAX_STALL_FRACTION = 0.03
# Steps without a write in flight that the cost's baseline step time is the median of.
BASELINE_STEPS = 32
# The writer's slots on the step's ballot (`CheckpointWriter.cast`): the ranks whose write finished
# (or that have none in flight), and those whose clock says a time-based checkpoint is due.
WRITTEN, INTERVAL_DUE = "checkpoint_written", "checkpoint_interval_due"
# The key of a committed checkpoint's report that names the step it holds: the commit's report
# carries a later step's metrics (`training.launch.attempt_store` resumes from this one).
CHECKPOINT_STEP_KEY = "checkpoint_step"
# torch 2.11's DefaultStager closes its copier after one synchronous `stage` (a second then fails
# with KeyError <class 'type'>: seen on an H100, bench/reports/checkpoint-overhead_cpu-h100_202612.md);
# from 2.13 one stager serves the run and keeps its pinned buffers (torch 2.13:
# torch/distributed/checkpoint/_state_dict_stager.py caches the storages it pinned per instance).
STAGER_KEPT_FROM = (2, 13)


def _local_numel(parameter: torch.Tensor) -> int:
    """The elements of this rank's shard of a parameter (a DTensor's local part under FSDP2)."""
    local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
    return int(local.numel())


def stager_kept(version: str = torch.__version__) -> bool:
    """Whether one stager serves every write of the run on this torch."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) >= STAGER_KEPT_FROM


class Publisher(Protocol):
    """What the writer needs of the launcher's session (training/session.py `Session`)."""

    rank: int
    world_size: int

    def checkpoint_folder(self, step: int) -> str: ...

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None: ...

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None: ...


def checkpoint_interval_s(wanted_s: float, cost_s: float | None) -> float:
    """Seconds between time-based checkpoints: --checkpoint-interval-s, lengthened where one
    checkpoint's measured cost would take more than MAX_STALL_FRACTION of the time between two
    (interval >= cost_s / 0.03: a checkpoint costing 3 s allows one every 100 s). 0 (no
    time-based checkpoints) stays 0."""
    if not wanted_s or cost_s is None:
        return wanted_s
    return max(wanted_s, cost_s / MAX_STALL_FRACTION)


def stall_fraction(cost_s: float, interval_s: float) -> float:
    """The share of the run's time that checkpoints `interval_s` apart, each costing `cost_s`,
    take from training."""
    return cost_s / (interval_s + cost_s)


def write_cost_s(stall_s: float, overlapped_s: Sequence[float], baseline_s: Sequence[float]) -> float:
    """What one checkpoint cost the run: its stall (staging, the commit) and what the steps it was
    written behind took beyond as many steps without a write (their median: a writer thread
    competes with training for the host's cores and memory bandwidth). Before any step ran without
    a write, the stall alone."""
    if not baseline_s:
        return stall_s
    excess = sum(overlapped_s) - statistics.median(baseline_s) * len(overlapped_s)
    return stall_s + max(0.0, excess)


@dataclass
class _Write:
    step: int
    folder: str
    state: dict[str, Any]
    future: Future[Any]
    started_at: float  # on the writer's clock
    staging_s: float  # what starting it stalled the step
    stager: DefaultStager  # its CPU copy: the run's, or its own (closed with it) before torch 2.13
    metrics: dict[str, Any]  # its step's, published with it where no later step's are (a divergence)
    done_at: float | None = None  # when its future completed, on the writer's clock


class CheckpointWriter:
    """One rank's checkpoint writes and their commits. Collective to build (its gloo group)."""

    def __init__(
        self,
        session: Publisher,
        model: nn.Module,
        optimizer: Optimizer,
        interval_s: float,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
        committed_step: int = 0,
    ) -> None:
        """`log`: where a commit is told (rank 0's console); `committed_step`: the step of the
        checkpoint the run resumed from (0: none)."""
        self.session, self.model, self.optimizer = session, model, optimizer
        self.log = log
        self.wanted_interval_s, self.clock = interval_s, clock
        self.group = dist.new_group(backend="gloo")
        self.device = device
        self.pin_memory = device.type == "cuda"
        self.stager: DefaultStager | None = None  # the run's, where kept (`stager_kept`)
        self.pending: _Write | None = None
        self.since = clock()  # the last checkpoint's start, or the run's
        self.cost_s: float | None = None  # the last committed checkpoint's `write_cost_s`
        self.last_report: float | None = None
        self.overlapped: list[float] = []  # the steps the write in flight is behind, their times
        self.baseline: deque[float] = deque(maxlen=BASELINE_STEPS)  # steps with no write in flight
        self.all_written = True
        self.interval_due = False
        self.write_s: float | None = None  # the last committed write's, from its start to its end
        self.committed_step = committed_step  # the latest checkpoint committed, which a restart resumes from

    @property
    def interval_s(self) -> float:
        return checkpoint_interval_s(self.wanted_interval_s, self.cost_s)

    @staticmethod
    def register(ballot: StepBallot) -> None:
        ballot.register(WRITTEN, INTERVAL_DUE)

    def cast(self, ballot: StepBallot) -> None:
        """This rank's counts for the step's all-reduce: its write finished (or none in flight), and
        its clock says a time-based checkpoint is due."""
        written = self.pending is None or self.pending.future.done()
        interval = self.interval_s
        due = bool(interval) and self.clock() - self.since >= interval
        ballot.cast(WRITTEN, 1.0 if written else 0.0)
        ballot.cast(INTERVAL_DUE, 1.0 if due else 0.0)

    def count(self, ballot: StepBallot) -> None:
        """The counts summed over the ranks: the same decisions on every rank."""
        self.all_written = ballot.counted(WRITTEN) >= self.session.world_size
        self.interval_due = ballot.counted(INTERVAL_DUE) > 0

    def report(
        self,
        metrics: dict[str, Any],
        step: int,
        *,
        state: dict[str, Any] | None,
        last: bool,
        save: Callable[[str], None] | None,
        commit_in_flight: bool = False,
    ) -> None:
        """The step's report through the session. A write every rank finished is committed now;
        `state` (a checkpoint due that is not the run's last) starts a write behind the next steps,
        after the one in flight is committed; at the `last` step the write in flight is committed
        and `save`, where given, writes the final checkpoint synchronously. `commit_in_flight` (a
        drain's choice) waits for the write in flight and commits it now."""
        now = self.clock()
        if self.last_report is not None:  # the step since the last report: its work
            (self.overlapped if self.pending is not None else self.baseline).append(now - self.last_report)
        try:
            published = False
            if self.pending is not None and (
                self.all_written or state is not None or last or commit_in_flight
            ):
                self._commit(metrics, step)
                published = True
            if save is not None:
                self.session.report(metrics, step, save)
            else:
                if state is not None:
                    self._start(step, state, metrics)
                if not published:
                    self.session.report(metrics, step, None)
        finally:
            self.last_report = self.clock()

    def next_write_s(self) -> float:
        """What a write would take now: the last one's, measured, or one estimated from this rank's
        shards at the declared rate (`training.config.drain_budget`)."""
        if self.write_s is not None:
            return self.write_s
        local = sum(_local_numel(parameter) for parameter in self.model.parameters())
        shard_bytes = local * CHECKPOINT_BYTES_PER_PARAMETER
        return shard_bytes / drain_budget.STAGE_BYTES_PER_S + drain_budget.write_s(shard_bytes)

    def drain(self, deadline: float | None, now: float) -> DrainChoice:
        """Collective, on every rank at the step a drain notice was agreed: what to checkpoint before
        `deadline` (epoch seconds; None: unknown), agreed by all ranks (one all-reduce on the training
        group, idle between steps: the writer's own group may be busy with the write in flight). A
        write in flight that is not to be committed is dropped."""
        left = None if deadline is None else deadline - now
        pending, write_s = self.pending, self.next_write_s()
        in_flight = None
        if pending is not None:
            elapsed = self.clock() - pending.started_at
            in_flight = 0.0 if pending.future.done() else max(0.0, write_s - elapsed)
        mine = drain_choice(left, in_flight, write_s)
        flags = torch.tensor([float(mine.commit_in_flight), float(mine.write)], device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        agreed = DrainChoice(bool(flags[0].item()), bool(flags[1].item()))
        if pending is not None and not agreed.commit_in_flight:
            self.abandon()
        return agreed

    def abandon(self) -> None:
        """Drop the write in flight without committing it: its folder is never complete, and a later
        attempt removes it. Its thread ends on its own; nothing waits for it."""
        if self.pending is not None and self.pending.stager is not self.stager:
            self.pending.stager.close()
        self.pending = None
        self.overlapped = []

    def commit_in_flight(self) -> None:
        """Collective, on every rank at a step that diverged (every rank decides that alike, on the
        step's all-reduce): the write in flight holds a step before it, which the run keeps."""
        if self.pending is not None:
            self._commit(self.pending.metrics, self.pending.step)

    def _new_stager(self) -> DefaultStager:
        return DefaultStager(
            StagingOptions(
                use_pinned_memory=self.pin_memory,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
        )

    def _start(self, step: int, state: dict[str, Any], metrics: dict[str, Any]) -> None:
        started = self.since = self.clock()
        folder = self.session.checkpoint_folder(step)
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        if not stager_kept():
            stager = self._new_stager()
        else:
            stager = self.stager = self.stager or self._new_stager()
        result = dcp.async_save(
            {"model": model_state, "optimizer": optimizer_state},
            storage_writer=storage.storage_writer(folder),
            process_group=self.group,
            async_stager=stager,
        )
        future = result if isinstance(result, Future) else result.upload_completion
        write = _Write(step, folder, state, future, started, self.clock() - started, stager, metrics)
        future.add_done_callback(lambda _: setattr(write, "done_at", self.clock()))
        self.pending = write

    def _agree(self, mine: bool) -> bool:
        """Whether every rank holds `mine` true: one all-reduce on the writer's gloo group."""
        flag = torch.tensor([1.0 if mine else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def _commit(self, metrics: dict[str, Any], step: int) -> None:
        """Collective: waits for this rank's write (every rank's has finished, or each waits for its
        own at this same step); if every rank's write succeeded and every shard is in storage at its
        size (rank 0 reads the DCP metadata), rank 0 marks the folder complete and the session
        publishes it, else the step is reported without it. The metrics published are the step's,
        ranked by the checkpoint's own score and naming the step it holds."""
        started = self.clock()
        write, self.pending = self.pending, None
        assert write is not None
        failure = None
        try:
            write.future.result()
        except (
            Exception,
            CheckpointException,
        ) as error:  # an upload refused or cut, here or on a rank DCP names
            failure = write_error(error)
        if write.stager is not self.stager:
            write.stager.close()
        problems = storage.missing_files(write.folder) if failure is None and self.session.rank == 0 else []
        if not self._agree(failure is None and not problems):
            self._drop(write, failure or "; ".join(problems) or "another rank's write failed", metrics, step)
            return
        if self.session.rank == 0:
            write_train_state(write.folder, write.state)
        self.write_s = (write.done_at or self.clock()) - write.started_at
        self.committed_step = write.step
        score = {CHECKPOINT_SCORE: write.state.get(CHECKPOINT_SCORE), CHECKPOINT_STEP_KEY: write.step}
        self.session.publish({**metrics, **score}, write.step, write.folder)
        stall_s = write.staging_s + self.clock() - started
        self.cost_s = write_cost_s(stall_s, self.overlapped, self.baseline)
        self.overlapped = []
        if self.log is not None:
            self.log(commit_line(write.step, step, stall_s, self.cost_s))

    def _drop(self, write: _Write, why: str, metrics: dict[str, Any], step: int) -> None:
        """A write that is not whole: never published, its folder removed; the step reported alone."""
        self.overlapped = []
        if self.session.rank == 0:
            with contextlib.suppress(OSError):
                storage.remove(write.folder)
        if self.log is not None:
            self.log(dropped_line(write.step, why))
        self.session.report(metrics, step, None)

    def close(self) -> None:
        """At the run's end, or when it raised: a write still in flight is left uncommitted (its
        folder never complete, removed by the next attempt); it is not waited for, as its
        collectives may wait on a rank that is gone. The stager's buffers are freed."""
        self.abandon()
        if self.stager is not None:
            self.stager.close()
        self.stager = None


def dropped_line(written: int, why: str) -> str:
    return (
        f"checkpoint of step {written} not committed, its write is not whole ({why}): a restart "
        "resumes from the checkpoint committed before it"
    )


def commit_line(written: int, committed: int, stall_s: float, cost_s: float) -> str:
    return (
        f"checkpoint of step {written} committed at step {committed}, written behind "
        f"{committed - written} steps; it stalled training {stall_s:.2f} s and cost the run "
        f"{cost_s:.2f} s in all"
    )
