"""The loop's own checks: a resume that would not replay the same rows, and a diverging run stopped before its optimizer step."""

from __future__ import annotations

import contextlib
import itertools
import math

import pytest
import torch

from training.config.run_config import (
    SYNTHETIC,
    parse_args,
)


def test_a_resume_with_another_accumulation_or_batch_size_is_refused():
    from training.errors import UsageError
    from training.loop import check_resume, replay_facts

    config = parse_args(["--batch-size", "3", "--grad-accum-steps", "2"])
    facts = replay_facts(config, 2, "abc")
    check_resume({"step": 4, "batch_size": 3, "grad_accum_steps": 2}, facts, 30, "ckpt")
    with pytest.raises(
        UsageError, match=r"^ckpt was written with --grad-accum-steps 4: resume with the same"
    ):
        check_resume({"step": 4, "batch_size": 3, "grad_accum_steps": 4}, facts, 30, "ckpt")
    with pytest.raises(UsageError, match=r"^ckpt was written with --batch-size 8:"):
        check_resume({"step": 4, "batch_size": 8, "grad_accum_steps": 1}, facts, 30, "ckpt")
    # A checkpoint from before accumulation existed: one micro-batch, batch size not recorded.
    with pytest.raises(UsageError, match=r"--grad-accum-steps 1:"):
        check_resume({"step": 4}, facts, 30, "ckpt")
    check_resume({"step": 4}, replay_facts(parse_args(["--batch-size", "3"]), 2, "abc"), 30, "ckpt")


@pytest.mark.parametrize(
    ("loss", "grad_norm", "quantity", "value"),
    [
        (math.nan, 1.0, "loss", "nan"),
        (math.inf, math.nan, "loss", "inf"),
        (2.5, -math.inf, "gradient norm", "-inf"),
    ],
)
def test_divergence_names_the_step_the_quantity_its_value_and_the_fix(loss, grad_norm, quantity, value):
    from training.loop import divergence

    message = divergence(7, loss=loss, grad_norm=grad_norm, lr=3e-3)
    assert message is not None and "\n" not in message
    assert message.startswith(f"step 7: the {quantity} is {value};")
    assert "--lr (this step's: 0.003)" in message and "data" in message and "bf16" in message
    assert divergence(7, loss=2.5, grad_norm=1e30, lr=3e-3) is None


class _RecordingSession:
    """A one-rank launcher session that records the steps it was asked to checkpoint."""

    rank, world_size, local_world_size, device = 0, 1, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.checkpointed: list[int] = []
        self.finished = False

    @contextlib.contextmanager
    def latest_checkpoint(self):
        yield None

    def corpus(self, config):
        raise AssertionError("the test trains on synthetic data")

    def report(self, metrics, step, save):
        assert math.isfinite(metrics["loss"])
        if save is not None:
            self.checkpointed.append(step)

    def finish(self, summary, history):
        self.finished = True


def _train_until_it_stops(monkeypatch, argv: list[str], hook=None) -> tuple[str, _RecordingSession, dict]:
    """Train the tiny model on synthetic rows, checkpointing every step; the DivergedError's
    message, the session and the weights the loop was left with (as full tensors)."""
    import training.loop
    from training.errors import DivergedError

    built = []

    def build_and_keep(config, session):
        parts = original_build(config, session)
        if hook is not None:
            parts[0].register_forward_hook(hook)
        built.append(parts[0])
        return parts

    original_build = training.loop.build
    monkeypatch.setattr(training.loop, "build", build_and_keep)
    config = parse_args(
        [
            "--data",
            SYNTHETIC,
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--checkpoint-every",
            "1",
            "--no-tensorboard",
            *argv,
        ]
    )
    session = _RecordingSession()
    with pytest.raises(DivergedError) as raised:
        training.loop.train(config, session)
    weights = {name: param.detach().full_tensor() for name, param in built[0].named_parameters()}
    return str(raised.value), session, weights


def test_a_non_finite_gradient_norm_stops_the_run_before_the_optimizer_step(monkeypatch, one_rank_group):
    """From the second forward on, the loss stays finite but its gradient is NaN, and so is every
    weight's: made so by a hook, not left to which of forward or backward overflows first at a
    huge --lr (that depends on the CPU's floating-point path)."""
    forwards = itertools.count(1)

    def poison_gradients(module, args, loss):
        if next(forwards) >= 2:
            loss.register_hook(lambda grad: grad * math.nan)

    message, session, weights = _train_until_it_stops(
        monkeypatch, ["--lr", "3e-3", "--warmup-steps", "0", "--steps", "5"], poison_gradients
    )
    assert (
        message.startswith("step 2: the gradient norm is nan;")
        and "Lower --lr (this step's: 0.003)" in message
    )
    assert all(weight.isfinite().all() for weight in weights.values()), (
        "a non-finite update reached the weights"
    )
    assert session.checkpointed == [1] and not session.finished


def test_a_non_finite_loss_stops_the_run_before_the_optimizer_step(monkeypatch, one_rank_group):
    """From the third forward on, the loss is NaN (and so are its gradients)."""
    forwards = itertools.count(1)

    def poison(module, args, loss):
        return loss * math.nan if next(forwards) >= 3 else loss

    message, session, weights = _train_until_it_stops(monkeypatch, ["--steps", "5"], poison)
    assert message.startswith("step 3: the loss is nan;")
    assert all(weight.isfinite().all() for weight in weights.values()), (
        "a non-finite update reached the weights"
    )
    assert session.checkpointed == [1, 2] and not session.finished
