"""--deadline: the run ends, with a checkpoint of its last step, before a wall-clock time (a
capacity reservation's end, as AWS gives its `EndDate`).

The loop asks before each step's all-reduce whether one more step and its checkpoint would still
fit; the vote is one slot of the step's ballot (`training.distributed.ballot`), so all ranks stop
after the same step, whatever each one's clock says. The time kept back (`margin_s`) is
the checkpoint's write and upload, the slowest step twice (the rest of this one and the next), and
an evaluation, which every checkpoint brings when the run evaluates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import torch
import torch.distributed as dist

from training.config.deadline_margin import (
    WIND_DOWN_S,
    estimated_checkpoint_s,
    estimated_export_s,
    margin_s,
)
from training.config.settings import DEADLINE_FLAG as FLAG
from training.distributed.ballot import StepBallot
from training.errors import UsageError

# The deadline's slot on the step's ballot: how many ranks vote to stop after this step.
STOP_SLOT = "deadline_stop"


def deadline_epoch(text: str) -> float:
    """The seconds since the epoch of a `parse_deadline` value."""
    return datetime.fromisoformat(text).timestamp()


def refusal(deadline: str, now: float, checkpoint_s: float) -> str | None:
    """Why a run cannot start at `now` with this deadline: it is past, or too near to write even
    one checkpoint (of the estimated `checkpoint_s`) and wind down."""
    left = deadline_epoch(deadline) - now
    if left <= 0:
        return f"{FLAG} {deadline} is past ({-left:.0f} s ago): pass a later time or leave {FLAG} out"
    needed = checkpoint_s + WIND_DOWN_S
    if left <= needed:
        return (
            f"{FLAG} {deadline} is {left:.0f} s away, less than a checkpoint and the run's end take "
            f"({needed:.0f} s): pass a later time or leave {FLAG} out"
        )
    return None


class Deadline:
    """A rank's view of the deadline: what it measured and its vote to stop. `clock` is
    `time.time` (wall time, against the deadline); tests pass their own."""

    def __init__(
        self,
        deadline: str,
        parameters: int,
        evaluates: bool,
        export_dtype: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`export_dtype`: with --export-hf, the exported dtype; the export, written at the last
        step alone, is never measured before it and stays an estimate."""
        self.deadline, self.end = deadline, deadline_epoch(deadline)
        self.evaluates, self.clock = evaluates, clock
        self.checkpoint_s = estimated_checkpoint_s(parameters)
        self.export_s = estimated_export_s(parameters, export_dtype) if export_dtype else 0.0
        self.checkpoint_measured = False
        self.slowest_step_s = 0.0
        self.eval_s: float | None = None
        self.step_started = clock()

    def check_start(self, device: torch.device) -> None:
        """Collective: raises the same one-line `UsageError` on every rank when any rank's clock
        finds the deadline past or too near (`refusal`)."""
        problem = refusal(self.deadline, self.clock(), self.checkpoint_s)
        flag = torch.tensor([1.0 if problem else 0.0], dtype=torch.float64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            raise UsageError(
                problem or f"{FLAG} {self.deadline}: another rank's clock finds it past or too near"
            )

    def start_step(self) -> None:
        self.step_started = self.clock()

    def margin_s(self) -> float:
        now = self.clock()
        slowest = max(self.slowest_step_s, now - self.step_started)
        # Before the first evaluation is timed, a step's time stands for it.
        eval_s = (self.eval_s if self.eval_s is not None else slowest) if self.evaluates else 0.0
        return margin_s(
            checkpoint_s=self.checkpoint_s, slowest_step_s=slowest, eval_s=eval_s, export_s=self.export_s
        )

    def vote(self) -> bool:
        """This rank's wish to stop after the step now running: the next would not fit."""
        return self.clock() + self.margin_s() > self.end

    @staticmethod
    def register(ballot: StepBallot) -> None:
        ballot.register(STOP_SLOT)

    def cast(self, ballot: StepBallot) -> None:
        """This rank's `vote` on the step's ballot, before its all-reduce."""
        ballot.cast(STOP_SLOT, 1.0 if self.vote() else 0.0)

    @staticmethod
    def agreed(ballot: StepBallot) -> bool:
        """After the step's all-reduce, alike on every rank: some rank voted to stop after it."""
        return ballot.counted(STOP_SLOT) > 0

    def left_s(self) -> float:
        return self.end - self.clock()

    def record(self, *, iteration_s: float, eval_s: float | None, checkpoint_s: float | None) -> None:
        """A step's times: its whole iteration, of which its evaluation and checkpoint (None
        where it had none) are measured apart."""
        self.slowest_step_s = max(self.slowest_step_s, iteration_s - (eval_s or 0.0) - (checkpoint_s or 0.0))
        if eval_s is not None:
            self.eval_s = eval_s
        if checkpoint_s is not None:
            self.checkpoint_s, self.checkpoint_measured = checkpoint_s, True
