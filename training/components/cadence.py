"""When a step evaluates, checkpoints and ends the run: one decision a step, taken alike on every
rank from what every rank agreed (the step's ballot, the all-reduced eval loss).

A checkpoint is due every --checkpoint-every steps and at the run's last step (--steps, or where it
stops early), at the last for --export-hf too, and whatever the step counts say at a forced one:
the deadline's stop, a drain's own write, or the time interval (--checkpoint-interval-s). Once a
drain was acted on, neither the interval nor the step counts start a write before the last step
(it would be cut). An evaluation runs every --eval-every steps, after --steps and wherever the step
counts or a forced case make a checkpoint due (even one a drain holds back), whose eval_loss ranks
it among the checkpoints kept (`training.components.checkpoint.checkpoints_kept`).
--early-stop-patience N ends the run where the last N evaluations found no eval_loss below the
best before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from training.components.evaluate import evaluations_since_best
from training.config.run_config import TrainConfig


@dataclass(frozen=True)
class Signals:
    """What the ranks agreed at this step's end, before the cadence decides."""

    deadline_stop: bool = False  # some rank's --deadline vote: stop after this step
    drained: bool = False  # a drain notice is acted on at this step (`DrainWatch.decide`)
    drain_write: bool = False  # the drain's agreed choice writes this step's checkpoint
    interval_due: bool = False  # the time-based checkpoint's interval passed on some rank


@dataclass(frozen=True)
class Decision:
    """What this step does after its optimizer step: `eval_loss` (None: no evaluation),
    `checkpoint`, and whether it is the run's `last` (and why it ends before --steps)."""

    eval_loss: float | None
    checkpoint: bool
    last: bool
    stopped_early: bool
    stopped_at_deadline: bool


class Cadence:
    """The run's evaluation, checkpoint and stop cadence, asked once per step (`decide`)."""

    def __init__(self, config: TrainConfig, history: Sequence[dict[str, Any]] = ()) -> None:
        """`history`: the resumed run's, whose evaluations early stopping counts on from."""
        self.steps, self.every = config.steps, config.checkpoint_every
        self.export_hf, self.evaluates = config.export_hf, config.eval_data is not None
        self.eval_every, self.patience = config.eval_every, config.early_stop_patience
        self.evaluations = [
            {"step": entry["step"], "eval_loss": entry["eval_loss"]}
            for entry in history
            if entry.get("eval_loss") is not None
        ]
        self.draining = False  # a drain notice was acted on in this attempt

    def _checkpoint_due(self, step: int, last: bool) -> bool:
        due = self.every and (step % self.every == 0 or last)
        return bool(due or (self.export_hf and last))

    def _eval_due(self, step: int, checkpoint_due: bool) -> bool:
        every = self.eval_every
        return self.evaluates and (step == self.steps or checkpoint_due or bool(every and step % every == 0))

    def _stops_early(self) -> bool:
        return bool(self.patience) and evaluations_since_best(self.evaluations) >= self.patience

    def decide(self, step: int, signals: Signals, evaluate: Callable[[], float]) -> Decision:
        """This step's decision; `evaluate` (collective) runs when an evaluation is due. The
        evaluation is due by the step counts before an early stop, which its own result decides;
        an early stop then makes the step the last, with its checkpoint."""
        self.draining = self.draining or signals.drained
        at_deadline = signals.deadline_stop and step < self.steps
        forced = at_deadline or signals.drain_write or (signals.interval_due and not self.draining)
        by_counts = self._checkpoint_due(step, last=step == self.steps) or forced
        eval_loss = evaluate() if self._eval_due(step, by_counts) else None
        if eval_loss is not None:
            self.evaluations.append({"step": step, "eval_loss": eval_loss})
        # The eval loss is all-reduced: every rank decides alike.
        stopped_early = eval_loss is not None and step < self.steps and self._stops_early()
        last = step == self.steps or stopped_early or at_deadline
        checkpoint = (self._checkpoint_due(step, last) and (last or not self.draining)) or forced
        return Decision(eval_loss, checkpoint, last, stopped_early, at_deadline)
