"""The step's one decision (training/components/cadence.py): when a step evaluates, checkpoints and
ends the run, from the step counts, the early stop and the forced cases (the deadline's stop, a
drain's write, the time interval)."""

from __future__ import annotations

import dataclasses

from training.components.cadence import Cadence, Decision, Signals
from training.config.run_config import SYNTHETIC, parse_args


def _config(*argv: str, **evaluation):
    """The flags `argv`; `evaluation`: eval_data, eval_every, early_stop_patience (which need a
    held-out file to parse)."""
    config = parse_args(["--data", SYNTHETIC, "--steps", "10", "--no-tensorboard", *argv])
    return dataclasses.replace(config, **evaluation)


def _never() -> float:
    raise AssertionError("no evaluation is due")


def _run(cadence: Cadence, steps: range, signals: dict[int, Signals] | None = None, losses=None):
    """Each step's decision; `losses`: the eval loss of each evaluation, in turn."""
    evaluations = iter(losses or [])
    return {
        step: cadence.decide(step, (signals or {}).get(step, Signals()), lambda: next(evaluations))
        for step in steps
    }


def test_a_checkpoint_every_n_steps_and_at_the_last():
    decisions = _run(Cadence(_config("--checkpoint-every", "4")), range(1, 11))
    assert [step for step, decision in decisions.items() if decision.checkpoint] == [4, 8, 10]
    assert [step for step, decision in decisions.items() if decision.last] == [10]
    assert decisions[10] == Decision(None, True, True, stopped_early=False, stopped_at_deadline=False)


def test_no_checkpoint_without_an_interval_but_an_export_at_the_last():
    assert not any(
        decision.checkpoint
        for decision in _run(Cadence(_config("--checkpoint-every", "0")), range(1, 11)).values()
    )
    exported = _run(Cadence(_config("--checkpoint-every", "0", "--export-hf")), range(1, 11))
    assert [step for step, decision in exported.items() if decision.checkpoint] == [10]


def test_an_evaluation_every_n_steps_at_every_checkpoint_and_after_the_last():
    config = _config("--checkpoint-every", "4", eval_data="held-out.jsonl", eval_every=3)
    decisions = _run(Cadence(config), range(1, 11), losses=[5.0 - index / 10 for index in range(10)])
    assert [step for step, decision in decisions.items() if decision.eval_loss is not None] == [
        3,
        4,
        6,
        8,
        9,
        10,
    ]
    cadence = Cadence(_config("--checkpoint-every", "4"))
    assert cadence.decide(4, Signals(), _never).eval_loss is None  # no --eval-data, no evaluation


def test_an_early_stop_makes_the_step_the_last_with_its_checkpoint():
    config = _config("--checkpoint-every", "4", eval_data="e", eval_every=1, early_stop_patience=2)
    decisions = _run(Cadence(config), range(1, 4), losses=[3.0, 3.5, 3.2])
    assert decisions[3] == Decision(3.2, True, True, stopped_early=True, stopped_at_deadline=False)
    assert not decisions[2].last


def test_the_resumed_history_counts_towards_the_early_stop():
    config = _config(eval_data="e", eval_every=1, early_stop_patience=2)
    history = [
        {"step": 1, "eval_loss": 3.0},
        {"step": 2, "eval_loss": 3.5, "loss": 4.0},
        {"step": 3, "eval_loss": None},
    ]
    decision = Cadence(config, history).decide(4, Signals(), lambda: 3.1)
    assert decision.stopped_early and decision.last


def test_the_deadline_stops_before_the_last_step_with_a_checkpoint():
    decisions = _run(
        Cadence(_config("--checkpoint-every", "0")), range(1, 6), {5: Signals(deadline_stop=True)}
    )
    assert decisions[5] == Decision(None, True, True, stopped_early=False, stopped_at_deadline=True)
    at_last = Cadence(_config("--checkpoint-every", "0")).decide(10, Signals(deadline_stop=True), _never)
    assert at_last.last and not at_last.stopped_at_deadline  # --steps ended it anyway


def test_a_drain_write_and_the_interval_force_a_checkpoint_and_its_evaluation():
    config = _config("--checkpoint-every", "0", eval_data="e")
    cadence = Cadence(config)
    assert cadence.decide(3, Signals(interval_due=True), lambda: 2.0) == Decision(
        2.0, True, False, False, False
    )
    assert cadence.decide(4, Signals(drained=True, drain_write=True), lambda: 2.1).checkpoint


def test_once_a_drain_was_acted_on_no_interval_or_periodic_checkpoint_starts():
    """A write started then would be cut. The step counts still make the evaluation due."""
    cadence = Cadence(_config("--checkpoint-every", "2", eval_data="e"))
    assert not cadence.decide(1, Signals(drained=True), _never).checkpoint
    assert not cadence.decide(3, Signals(interval_due=True), _never).checkpoint
    periodic = cadence.decide(4, Signals(), lambda: 2.0)
    assert (periodic.eval_loss, periodic.checkpoint) == (2.0, False)
    assert cadence.decide(10, Signals(), lambda: 1.9).checkpoint  # the last step's still is
