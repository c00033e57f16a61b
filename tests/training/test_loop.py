"""The loop's own checks: a resume that would not replay the same rows, and a diverging run stopped before its optimizer step."""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import tempfile

import pytest
import torch

from training.config.run_config import (
    SYNTHETIC,
    parse_args,
)


def test_a_resume_keeps_the_global_batch_however_workers_and_micro_batches_split_it():
    """A checkpoint of 2 workers x --batch-size 8 x 1 micro-batch (16 sequences a step) resumes on
    1 worker x 2 micro-batches, which trains on the same rows (`epoch_batches`); not on 1 x 1 (8)
    or 4 x 1 (32), nor with another --batch-size making 16."""
    from training.errors import UsageError
    from training.loop import check_resume, replay_facts

    saved = {"step": 4, **replay_facts(parse_args([]), 2, "abc")}
    assert saved["global_batch"] == 16
    check_resume(saved, replay_facts(parse_args(["--grad-accum-steps", "2"]), 1, "abc"), 30, "ckpt")
    with pytest.raises(UsageError) as halved:
        check_resume(saved, replay_facts(parse_args([]), 1, "abc"), 30, "ckpt")
    assert str(halved.value) == (
        "ckpt was written with a global batch of 16 sequences (world size 2 x --batch-size 8 x "
        "--grad-accum-steps 1); this run's is 8 (1 x 8 x 1): pass --grad-accum-steps 2 to keep it, "
        "or take its weights alone with --init-from"
    )
    with pytest.raises(
        UsageError, match=r"this run's is 32 \(4 x 8 x 1\): run workers x --grad-accum-steps = 2 "
    ):
        check_resume(saved, replay_facts(parse_args([]), 4, "abc"), 30, "ckpt")
    with pytest.raises(UsageError, match=r"^ckpt was written with --batch-size 8: resume with the same"):
        check_resume(
            saved,
            replay_facts(parse_args(["--batch-size", "4", "--grad-accum-steps", "2"]), 2, "abc"),
            30,
            "ckpt",
        )
    # Checkpoints from before these keys: checked on what they hold (no accumulation then).
    check_resume({"step": 4}, replay_facts(parse_args(["--batch-size", "3"]), 2, "abc"), 30, "ckpt")
    old = {"step": 4, "world_size": 2, "batch_size": 8}
    check_resume(old, replay_facts(parse_args(["--grad-accum-steps", "2"]), 1, "abc"), 30, "ckpt")
    with pytest.raises(UsageError, match=r"global batch of 16 sequences .*this run's is 32"):
        check_resume(old, replay_facts(parse_args(["--grad-accum-steps", "2"]), 2, "abc"), 30, "ckpt")


COSINE = ["--steps", "8", "--lr-schedule", "cosine", "--warmup-steps", "2"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--steps", "12"], "--steps 8 (its --lr-schedule cosine decays towards the last step)"),
        (["--lr", "0.01"], "--lr 0.003"),
        (["--warmup-steps", "3"], "--warmup-steps 2"),
        (["--min-lr-ratio", "0.1"], "--min-lr-ratio 0.0"),
        (["--lr-schedule", "linear"], "--lr-schedule cosine"),
        (["--lr-schedule", "constant"], "--lr-schedule cosine"),
    ],
)
def test_a_resume_that_changes_the_learning_rate_schedule_is_refused(flags, named):
    """Resumed at step 4 of a cosine run of 8 steps with --steps 12, step 5 trained at 2.65e-3
    instead of 1.96e-3, without a word."""
    from training.errors import UsageError
    from training.loop import check_resume, replay_facts

    saved = {"step": 4, **replay_facts(parse_args(COSINE), 2, "abc")}
    changed = parse_args([*COSINE, *flags])
    with pytest.raises(UsageError) as refused:
        check_resume(saved, replay_facts(changed, 2, "abc"), changed.steps, "ckpt")
    assert str(refused.value) == (
        f"ckpt was written with {named}: resume with the same, so the learning rate of every step is "
        "the uninterrupted run's, or take its weights alone with --init-from"
    )


def test_a_resume_may_change_what_its_schedule_does_not_read():
    """A constant rate does not depend on --steps (a run goes on past its end), nor cosine on
    --decay-ratio (wsd's)."""
    from training.loop import check_resume, replay_facts

    constant = {"step": 8, **replay_facts(parse_args(["--steps", "8"]), 2, "abc")}
    check_resume(constant, replay_facts(parse_args(["--steps", "20"]), 2, "abc"), 20, "ckpt")
    cosine = {"step": 4, **replay_facts(parse_args(COSINE), 2, "abc")}
    check_resume(cosine, replay_facts(parse_args([*COSINE, "--decay-ratio", "0.5"]), 2, "abc"), 8, "ckpt")
    wsd = ["--steps", "8", "--lr-schedule", "wsd"]
    saved = {"step": 4, **replay_facts(parse_args(wsd), 2, "abc")}
    from training.errors import UsageError

    with pytest.raises(UsageError, match=r"^ckpt was written with --decay-ratio 0.2: "):
        check_resume(saved, replay_facts(parse_args([*wsd, "--decay-ratio", "0.5"]), 2, "abc"), 8, "ckpt")


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

    def checkpoint_folder(self, step):
        """A checkpoint written behind the next steps is asked for here."""
        self.checkpointed.append(step)
        return tempfile.mkdtemp(prefix="checkpoint-")

    def publish(self, metrics, step, folder):
        assert math.isfinite(metrics["loss"])
        shutil.rmtree(folder)

    def finish(self, summary, history):
        self.finished = True

    def faults(self):
        return []  # a run that was never restarted (training.loop.Session.faults)


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
