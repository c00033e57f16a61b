"""Drain notices: the votes and the decision every rank takes alike (fake clocks), 20 SIGTERMs at
random moments of two simulated ranks' steps each committing a checkpoint of the step in progress
before a 30 s grace, a real SIGTERM to this process, and the vote counted in the step's all-reduce."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable

import torch

from training.components import drain
from training.components.drain import (
    POLL_EVERY_S,
    SIGTERM_SOURCE,
    DrainWatch,
    notice_line,
)
from training.config.drain_budget import DrainChoice
from training.distributed.ballot import StepBallot, step_sync
from training.session import Notice

GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds default, and Ray's drain deadline on SIGTERM


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_poll_is_voted_once_its_interval_passed_on_this_ranks_clock():
    clock = Clock()
    watch = DrainWatch(lambda: None, local=lambda: False, clock=clock)
    assert watch.votes() == (False, False)
    clock.now += POLL_EVERY_S
    assert watch.votes() == (True, False)
    # Without a launcher's poll there is nothing to vote for but a SIGTERM.
    assert DrainWatch(None, local=lambda: True, clock=clock).votes() == (False, True)


def test_every_rank_polls_where_any_voted_and_acts_on_a_notice_once():
    polls: list[float] = []
    notice = Notice("Ray Train preemption of node 3e136cdb, ranks 0, 1", deadline=2_000.0)
    clock = Clock()

    def poll() -> Notice | None:
        polls.append(clock.now)
        return notice if clock.now >= 1_010.0 else None

    watch = DrainWatch(poll, local=lambda: False, clock=clock)
    watch.tally([0, 0])
    assert not watch.decide() and polls == []  # no rank voted: no barrier
    watch.tally([1, 0])  # another rank's clock said a poll is due
    assert not watch.decide() and polls == [1_000.0]
    clock.now = 1_010.0
    watch.tally([2, 0])
    assert watch.decide() and watch.notice == notice
    watch.tally([2, 0])
    assert not watch.decide()  # the same notice: its checkpoint is written
    notice = Notice(notice.source, deadline=3_000.0)  # a later drain is a new notice
    watch.tally([1, 0])
    assert watch.decide()


def test_a_sigterm_on_one_rank_checkpoints_every_rank_once():
    watch = DrainWatch(None, local=lambda: False)
    watch.tally([0, 1])
    assert watch.decide() and watch.notice == Notice(SIGTERM_SOURCE)
    watch.tally([0, 1])
    assert not watch.decide()


def _trial(rng: random.Random) -> tuple[int, int, float]:
    """Two ranks, steps of one random length whose all-reduce comes at a random point of it, a
    checkpoint of a random write time, and a SIGTERM to rank 1 at a random moment: the step
    checkpointed, the step in progress at the signal, and the commit's time after the signal."""
    step_s, reduce_at, write_s = rng.uniform(0.1, 5.0), rng.uniform(0.5, 0.95), rng.uniform(0.5, 10.0)
    signal_at = rng.uniform(10.0, 60.0)
    clock = Clock(0.0)

    def signalled(rank: int) -> Callable[[], bool]:
        return lambda: rank == 1 and clock.now >= signal_at

    ranks = [DrainWatch(None, local=signalled(rank), clock=clock) for rank in range(2)]
    step = 0
    while step < 1_000:  # a notice never acted on fails below
        step += 1
        started = clock.now
        clock.now = started + reduce_at * step_s
        votes = [watch.votes() for watch in ranks]
        counts = [sum(vote[index] for vote in votes) for index in range(2)]
        for watch in ranks:
            watch.tally(counts)
        clock.now = started + step_s
        decisions = {watch.decide() for watch in ranks}
        assert len(decisions) == 1  # every rank alike
        if decisions.pop():
            in_progress = int(signal_at // step_s) + 1
            return step, in_progress, clock.now + write_s - signal_at
    raise AssertionError("the SIGTERM was never turned into a checkpoint")


def test_twenty_sigterms_commit_the_step_in_progress_before_a_30_s_grace():
    rng = random.Random(49)
    results = [_trial(rng) for _ in range(20)]
    for checkpointed, in_progress, commit_s in results:
        # The step in progress, or the next when the signal came after that step's all-reduce.
        assert checkpointed in (in_progress, in_progress + 1)
        assert commit_s < GRACE_S
    assert len(results) == 20


def test_a_real_sigterm_becomes_this_processs_notice():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        drain._sigterm.clear()
        drain.install_sigterm_notice()
        os.kill(os.getpid(), signal.SIGTERM)
        assert drain.sigterm_received()
        assert DrainWatch(None).votes() == (False, True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        drain._sigterm.clear()


def test_the_votes_are_counted_in_the_steps_all_reduce(one_rank_group):
    watch = DrainWatch(None, local=lambda: True)
    ballot = StepBallot()
    ballot.register("checkpoint_written")  # after the checkpoint writer's slot, as the loop puts it
    DrainWatch.register(ballot)
    ballot.cast("checkpoint_written", 1.0)
    watch.cast(ballot)
    loss, norm = step_sync(torch.tensor(1.5), torch.tensor(0.5), ballot)
    watch.count(ballot)
    assert (loss, norm, watch.counts) == (1.5, 0.5, (0, 1))
    assert watch.decide() and watch.notice == Notice(SIGTERM_SOURCE)


def test_the_notice_line_says_what_commits_before_the_deadline_or_where_a_restart_goes_back_to():
    notice = Notice("Ray Train preemption of node ab, ranks 1", 1_796_486_558.126)
    now = 1_796_486_532.0

    def line(commit_in_flight: bool, write: bool) -> str:
        choice = DrainChoice(commit_in_flight, write)
        return notice_line(notice, 57, now, choice, in_flight_step=55, write_s=21.4, committed_step=50)

    head = "drain notice (Ray Train preemption of node ab, ranks 1): "
    by = "before 2026-12-05T16:02:38Z (26 s left)"
    assert line(False, True) == f"{head}checkpointing step 57 {by}, about 21 s to write"
    assert line(True, False) == (
        f"{head}committing the checkpoint of step 55 in flight {by}; no new checkpoint is started"
    )
    assert line(False, False) == (
        f"{head}no checkpoint can commit {by}, one takes about 21 s: a restart resumes from step 50, "
        "the latest committed"
    )
    sigterm = notice_line(
        Notice(SIGTERM_SOURCE),
        3,
        0.0,
        DrainChoice(True, True),
        in_flight_step=2,
        write_s=1.0,
        committed_step=0,
    )
    assert "within the sender's grace period" in sigterm and sigterm.endswith(
        "the checkpoint of step 2 in flight is committed first"
    )
