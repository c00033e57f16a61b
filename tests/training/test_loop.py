"""The loop's own checks: a step accumulated over micro-batches is the step over all its rows, a
diverging run is stopped before its optimizer step, `train` stays short, and what the loop logs and
records around its steps."""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import tempfile

import pytest
import torch

from tests.harness.session_parts import Uninterrupted
from training.config.run_config import (
    SYNTHETIC,
    parse_args,
)


class _RecordingSession(Uninterrupted):
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

    def checkpoint_folder(self, step):
        """A checkpoint written behind the next steps is asked for here."""
        self.checkpointed.append(step)
        return tempfile.mkdtemp(prefix="checkpoint-")

    def publish(self, metrics, step, folder):
        assert math.isfinite(metrics["loss"])
        shutil.rmtree(folder)

    def finish(self, summary, history):
        self.finished = True


def _train_until_it_stops(monkeypatch, argv: list[str], hook=None) -> tuple[str, _RecordingSession, dict]:
    """Train the tiny model on synthetic rows, checkpointing every step; the DivergedError's
    message, the session and the weights the loop was left with (as full tensors)."""
    import training.loop
    from training.errors import DivergedError

    built = []

    def build_and_keep(config, session, **options):
        parts = original_build(config, session, **options)
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


def test_the_log_says_how_many_documents_were_truncated_to_a_row():
    from training.data.packing import PackingStats
    from training.loop import truncation_line

    cut = PackingStats(documents=2000, documents_truncated=3, tokens_truncated=412, filler_tokens=9)
    assert truncation_line("--data", "chat.jsonl", cut, 128) == (
        "--data chat.jsonl: 3 conversations of 2,000 documents longer than a row of 129 tokens, "
        "truncated to it (412 tokens dropped)"
    )
    assert truncation_line("--data", "chat.jsonl", PackingStats(documents=2000), 128) is None


# --- gradient accumulation in one process ------------------------------------------------------


def test_train_reads_in_one_screen():
    """`train` is the run's orchestration alone (resume, the steps, the summary): under 80 lines,
    and no function or method of the loop over 100."""
    import ast
    import inspect

    import training.loop

    tree = ast.parse(inspect.getsource(training.loop))
    lengths = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.end_lineno is not None
    }
    assert lengths["train"] < 80
    assert {name: length for name, length in lengths.items() if length > 100} == {}
