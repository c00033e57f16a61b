"""Drains turned into checkpoints: a notice that this run's node goes away (a Kubernetes eviction
or node drain, a spot interruption, a repair) makes every rank checkpoint the step it is in, at the
step's end, and train on; the restart after the node is gone resumes from that step.

Two sources feed the same notice, each agreed by all ranks at the same step through the step's
all-reduce (two slots of the step's ballot, `training.distributed.ballot`), as --deadline's vote
and the checkpoint writer's counts are:

- a launcher's poll (`poll`, Ray Train's `ray.train.get_preemption_info`, ray 2.58:
  ray/train/v2/api/train_fn_utils.py), a barrier every rank must call the same number of times: each
  rank votes that a poll is due when `POLL_EVERY_S` passed on its clock since the last, and all
  poll at the step where any rank voted so;
- a SIGTERM to the rank's own process (torchrun forwards the one it gets to every rank:
  `install_sigterm_notice`), voted by the rank that received it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from training.config.drain_budget import DrainChoice
from training.distributed.ballot import StepBallot
from training.session import Notice

# Seconds between polls of the launcher's preemption notice. Ray Train's PreemptionWatcher reads
# Ray Core's draining nodes every second (the Ray launcher's RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S)
# and Ray's own SIGTERM drain lasts 30 s (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S): a notice is acted
# on within 3 s of the drain plus a step, leaving the rest of the 30 s for the checkpoint. A poll is
# one barrier (3.3 ms on the 2-core CPU with 2 workers, docs/training/hangs-and-drains.md), so one
# every 2 s costs under 0.2%.
POLL_EVERY_S = 2.0
SIGTERM_SOURCE = "SIGTERM"
# What a shell reports for a process that a SIGTERM ended: a drained run did not finish.
DRAINED_EXIT_CODE = 128 + signal.SIGTERM
# The drain's slots on the step's ballot, in the order of `DrainWatch.votes`: the ranks whose clock
# says a poll is due, and those that received a SIGTERM.
POLL_SLOT, SIGTERM_SLOT = "drain_poll_due", "drain_sigterm"


_sigterm = threading.Event()


def install_sigterm_notice() -> None:
    """In a rank's main thread: a SIGTERM becomes this rank's drain notice instead of its end."""
    signal.signal(signal.SIGTERM, lambda signum, frame: _sigterm.set())


def sigterm_received() -> bool:
    return _sigterm.is_set()


class DrainWatch:
    """One rank's view of drain notices: its votes before a step's all-reduce (`votes`, cast on
    the step's ballot by `cast`), the ranks' counts after it (`tally`, read from the ballot by
    `count`), and the decision at the step's end (`decide`):
    `checkpoint_now` is the same on every rank."""

    def __init__(
        self,
        poll: Callable[[], Notice | None] | None,
        local: Callable[[], bool] = sigterm_received,
        clock: Callable[[], float] = time.time,
        poll_every_s: float = POLL_EVERY_S,
    ) -> None:
        self.poll, self.local, self.clock, self.poll_every_s = poll, local, clock, poll_every_s
        self.last_poll = clock()
        self.counts = (0, 0)
        self.acted_on: set[Notice] = set()
        self.notice: Notice | None = None
        self.checkpoint_now = False

    def votes(self) -> tuple[bool, bool]:
        """(a poll is due on this rank's clock, this rank received a SIGTERM)."""
        due = self.poll is not None and self.clock() - self.last_poll >= self.poll_every_s
        return due, self.local()

    @staticmethod
    def register(ballot: StepBallot) -> None:
        ballot.register(POLL_SLOT, SIGTERM_SLOT)

    def cast(self, ballot: StepBallot) -> None:
        """`votes` on the step's ballot, before its all-reduce."""
        for slot, vote in zip((POLL_SLOT, SIGTERM_SLOT), self.votes(), strict=True):
            ballot.cast(slot, 1.0 if vote else 0.0)

    def count(self, ballot: StepBallot) -> None:
        """`tally` of the ballot's sums, after the step's all-reduce."""
        self.tally([ballot.counted(POLL_SLOT), ballot.counted(SIGTERM_SLOT)])

    def tally(self, counts: Sequence[float]) -> None:
        """How many ranks cast each vote of `votes`, from the step's all-reduce."""
        self.counts = (round(counts[0]), round(counts[1]))

    def decide(self) -> bool:
        """At the step's end, on every rank alike: whether to checkpoint this step for a notice not
        yet acted on. The poll, where any rank voted for it, is made here by every rank."""
        polls, signalled = self.counts
        self.counts = (0, 0)
        notices = [Notice(SIGTERM_SOURCE)] if signalled else []
        if polls and self.poll is not None:
            self.last_poll = self.clock()
            if (polled := self.poll()) is not None:
                notices.append(polled)
        fresh = [notice for notice in notices if notice not in self.acted_on]
        self.acted_on.update(fresh)
        self.checkpoint_now = bool(fresh)
        if fresh:
            self.notice = fresh[0]
        return self.checkpoint_now


def notice_line(
    notice: Notice,
    step: int,
    now: float,
    choice: DrainChoice,
    *,
    in_flight_step: int | None,
    write_s: float,
    committed_step: int,
) -> str:
    """The log line of a notice acted on at `step`: what it checkpoints before the deadline, or that
    nothing can commit before it and which step a restart goes back to."""
    if notice.deadline is None:
        by = "within the sender's grace period"
    else:
        moment = datetime.fromtimestamp(notice.deadline, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        by = f"before {moment} ({notice.deadline - now:.0f} s left)"
    head = f"drain notice ({notice.source}): "
    if choice.write:
        first = (
            f"; the checkpoint of step {in_flight_step} in flight is committed first"
            if choice.commit_in_flight and in_flight_step is not None
            else ""
        )
        return f"{head}checkpointing step {step} {by}, about {write_s:.0f} s to write{first}"
    if choice.commit_in_flight:
        return f"{head}committing the checkpoint of step {in_flight_step} in flight {by}; no new checkpoint is started"
    return (
        f"{head}no checkpoint can commit {by}, one takes about {write_s:.0f} s: a restart resumes from "
        f"step {committed_step}, the latest committed"
    )
