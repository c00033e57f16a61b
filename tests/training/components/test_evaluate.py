"""Items of a real fine-tune: the learning-rate schedules, held-out evaluation and the
TensorBoard event files, checked against hand-computed numbers and the step stream."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.harness.session_parts import NoCheckpoints, Uninterrupted
from tests.harness.tensorboard_events import read_scalars
from training.components.evaluate import eval_batches
from training.components.optim import learning_rate
from training.config.run_config import (
    SHIPPED_CORPUS,
    SYNTHETIC,
    ArgumentsError,
    parse_args,
    parse_flags,
)
from training.data.packing import NO_LOSS
from training.metrics.report import parse_step_line
from training.metrics.tensorboard_sink import SCALARS, TENSORBOARD_DIR
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX, fused_linear_cross_entropy


def _lrs(schedule: str, steps: list[int], *extra: str) -> list[float]:
    config = parse_args(
        ["--lr", "0.01", "--steps", "10", "--warmup-steps", "2", "--lr-schedule", schedule, *extra]
    )
    return [learning_rate(config, step) for step in steps]


def test_constant_schedule_warms_up_then_holds_the_peak():
    assert _lrs("constant", [1, 2, 3, 10]) == pytest.approx([0.005, 0.01, 0.01, 0.01])


def test_linear_schedule_decays_to_the_minimum_at_the_last_step():
    # 8 steps after the warm-up; step 3 is 1/8 of the way from 0.01 to 0.001, step 6 half-way.
    got = _lrs("linear", [2, 3, 6, 10], "--min-lr-ratio", "0.1")
    assert got == pytest.approx([0.01, 0.008875, 0.0055, 0.001])


def test_cosine_schedule_follows_half_a_cosine_to_the_minimum():
    # Step 4 is a quarter of the way: 0.001 + 0.009 * (1 + cos(pi/4)) / 2 = 0.0086819805.
    got = _lrs("cosine", [2, 4, 6, 10], "--min-lr-ratio", "0.1")
    assert got == pytest.approx([0.01, 0.0086819805, 0.0055, 0.001])


def test_wsd_holds_the_peak_then_decays_over_the_last_fraction():
    # --decay-ratio 0.25 of the 8 steps after the warm-up: steps 9 and 10 decay.
    assert _lrs("wsd", [3, 8, 9, 10], "--decay-ratio", "0.25") == pytest.approx([0.01, 0.01, 0.005, 0.0])
    # 0.3 x 8 = 2.4 decay steps, rounded up to 3: steps 8 to 10, to 0.002 at the end.
    got = _lrs("wsd", [7, 8, 9, 10], "--decay-ratio", "0.3", "--min-lr-ratio", "0.2")
    assert got == pytest.approx([0.01, 0.01 * (0.2 + 0.8 * 2 / 3), 0.01 * (0.2 + 0.8 / 3), 0.002])


def test_a_warm_up_as_long_as_the_run_never_decays():
    config = parse_args(["--lr", "0.01", "--steps", "4", "--warmup-steps", "4", "--lr-schedule", "cosine"])
    assert [learning_rate(config, step) for step in (1, 4)] == pytest.approx([0.0025, 0.01])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--steps", "5", "--warmup-steps", "6"],
            "--warmup-steps 6 exceeds --steps 5: the warm-up must end by the last step",
        ),
        (["--min-lr-ratio", "1.5"], "argument --min-lr-ratio: must be from 0 to 1, got 1.5"),
        (["--decay-ratio", "0"], "argument --decay-ratio: must be > 0 and <= 1, got 0"),
        (
            ["--lr-schedule", "step"],
            "argument --lr-schedule: invalid choice: 'step' (choose from 'constant', 'linear', 'cosine', 'wsd')",
        ),
        (["--eval-every", "5"], "--eval-every 5 evaluates on --eval-data: set it"),
        (["--early-stop-patience", "2"], "--early-stop-patience 2 stops on the loss of --eval-data: set it"),
        (["--keep-checkpoints", "0"], "argument --keep-checkpoints: must be >= 1, got 0"),
        (
            ["--eval-data", SYNTHETIC],
            "--eval-data synthetic: random tokens hold nothing to learn; give a held-out corpus",
        ),
    ],
)
def test_bad_schedule_and_evaluation_flags_are_refused_in_one_line(flags, message):
    with pytest.raises(ArgumentsError) as raised:
        parse_flags(flags)
    assert str(raised.value) == message


def test_eval_batches_deal_every_row_in_corpus_order_and_fill_the_last_global_batch():
    rows = np.arange(9 * 3).reshape(9, 3)  # 9 rows: 3 global batches of 2 ranks x 2, the last filled
    mine = [eval_batches(rows, rank=rank, world_size=2, batch_size=2) for rank in (0, 1)]
    assert [[batch[:, 0].tolist() for batch in batches] for batches in mine] == [
        [[0, 6], [12, 18], [24, NO_LOSS]],
        [[3, 9], [15, 21], [NO_LOSS, NO_LOSS]],
    ]
    assert all(batch.dtype == np.int64 for batches in mine for batch in batches)
    filler = mine[1][-1]
    assert (filler == NO_LOSS).all() and model_batch(filler, torch.device("cpu")).loss_tokens == 0
    with pytest.raises(ValueError, match=r"^the corpus packs into no rows of 3 tokens: nothing to evaluate$"):
        eval_batches(rows[:0], rank=0, world_size=2, batch_size=8)


@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 8), (2, 8), (4, 8), (8, 2), (4, 64)])
def test_every_held_out_row_is_evaluated_once_on_any_world_size(world_size, batch_size):
    """125 rows (the worked example's held-out set at seq 128): dealt whole global batches only,
    2 x 8 evaluated 112 of them, 4 x 8 96, 1 x 8 120."""
    rows = np.arange(125 * 4).reshape(125, 4)
    dealt = [
        eval_batches(rows, rank=rank, world_size=world_size, batch_size=batch_size)
        for rank in range(world_size)
    ]
    assert len({len(batches) for batches in dealt}) == 1  # as many forwards on every rank
    evaluated = [row[0] for batches in dealt for batch in batches for row in batch if row[0] != NO_LOSS]
    assert sorted(evaluated) == rows[:, 0].tolist()


def test_the_gradient_free_loss_is_the_fused_loss():
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(50, 16, generator=generator)
    weight = torch.randn(300, 16, generator=generator, requires_grad=True)
    labels = torch.randint(0, 300, (50,), generator=generator)
    labels[[4, 17, 40]] = IGNORE_INDEX
    normalizer = torch.tensor(47.0)
    fused = fused_linear_cross_entropy(hidden, weight, labels, normalizer, 16)
    with torch.no_grad():
        plain = fused_linear_cross_entropy(hidden, weight, labels, normalizer, 16)
    want = torch.nn.functional.cross_entropy(hidden @ weight.detach().t(), labels, ignore_index=IGNORE_INDEX)
    assert fused.requires_grad and not plain.requires_grad
    assert plain.item() == pytest.approx(fused.item(), rel=1e-6) == pytest.approx(want.item(), rel=1e-5)


class _HeldOutSession(NoCheckpoints, Uninterrupted):
    """One rank on CPU: synthetic training rows, a fixed held-out set of random rows."""

    rank, world_size, local_world_size, device = 0, 1, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.summary: dict | None = None

    @contextlib.contextmanager
    def latest_checkpoint(self):
        yield None

    def corpus(self, config):
        raise AssertionError("the test trains on synthetic rows")

    def eval_rows(self, config):
        return np.random.default_rng(5).integers(0, 256, size=(5, config.seq_len + 1))

    def finish(self, summary, history):
        self.summary = {**summary, "history": history}


def test_a_run_reports_eval_loss_lr_and_grad_norm_and_tensorboard_holds_the_step_stream(
    tmp_path, capsys, one_rank_group
):
    from training.loop import train

    config = parse_args(
        [
            *("--data", SYNTHETIC, "--seq-len", "32", "--batch-size", "2", "--steps", "4"),
            *("--eval-data", str(SHIPPED_CORPUS), "--eval-every", "3", "--lr-schedule", "cosine"),
            *("--storage-path", str(tmp_path), "--run-name", "held-out", "--checkpoint-every", "0"),
        ]
    )
    session = _HeldOutSession()
    train(config, session)
    steps = [parsed for parsed in map(parse_step_line, capsys.readouterr().out.splitlines()) if parsed]

    assert [step["step"] for step in steps] == [1, 2, 3, 4]
    assert [step["lr"] for step in steps] == [learning_rate(config, step) for step in (1, 2, 3, 4)]
    assert all(step["grad_norm"] > 0 for step in steps)
    # Evaluated every 3 steps and after the last; random bytes sit near log(256) = 5.55.
    assert [step["eval_loss"] is not None for step in steps] == [False, False, True, True]
    for step in steps[2:]:
        assert 4 < step["eval_loss"] < 7 and step["eval_perplexity"] == pytest.approx(
            math.exp(step["eval_loss"])
        )
    assert session.summary is not None
    assert session.summary["eval_loss"] == steps[-1]["eval_loss"]
    assert [entry["grad_norm"] for entry in session.summary["history"]] == [
        step["grad_norm"] for step in steps
    ]

    scalars = read_scalars(tmp_path / "held-out" / TENSORBOARD_DIR)
    want = {
        tag: {step["step"]: step[key] for step in steps if step[key] is not None}
        for tag, key in SCALARS.items()
    }
    assert {tag for tag, values in want.items() if values} == set(scalars)
    for tag, values in scalars.items():
        assert values == pytest.approx(want[tag], rel=1e-6), tag  # event files hold float32


# --- the same weights, the same eval_loss on any world size ------------------------------------


def _evaluate_on_ranks(rank: int, world_size: int, init_file: str, rows_file: str, out: str) -> None:
    """The tiny model's seeded random init, sharded over `world_size` gloo ranks by the loop's
    `build`, evaluated by the loop's `evaluate` on the held-out rows dealt as a run deals them."""
    import torch.distributed as dist

    from tests.harness.build_session import BuildSession
    from training.build import build
    from training.components.evaluate import evaluate
    from training.distributed.rank_exit import end_rank_process, tear_down_process_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    config = parse_args(["--preset", "tiny"])
    model, _, _, _ = build(config, BuildSession(rank, world_size, world_size, torch.device("cpu")))
    rows = np.load(rows_file)
    batches = eval_batches(rows, rank=rank, world_size=world_size, batch_size=config.batch_size)
    loss = evaluate(model, batches, torch.device("cpu"))
    tear_down_process_group()
    if rank == 0:
        Path(out).write_text(repr(loss))
    end_rank_process(0)


@pytest.mark.slow
def test_the_same_weights_give_the_same_eval_loss_on_1_2_and_4_workers(tmp_path):
    """The worked example's held-out conversations (60 of them: 38 rows at seq 128, which fill no
    whole global batch of 4 x 8), evaluated by the same weights on 1, 2 and 4 ranks: the same loss,
    up to the order in which the ranks' sums are added (relative 1e-6)."""
    import torch.multiprocessing as mp

    from examples.instruction_data import write_dataset
    from tests.harness.packing_reference import corpus_rows

    write_dataset(tmp_path, train_rows=1, eval_rows=60, seed=0)
    rows = corpus_rows([str(tmp_path / "eval.jsonl")], tokenizer="bytes", seq_len=128)
    assert len(rows) % 32 and len(rows) % 16
    np.save(tmp_path / "rows.npy", rows)
    losses = {}
    for world_size in (1, 2, 4):
        out = tmp_path / f"loss{world_size}"
        args = (world_size, str(tmp_path / f"pg{world_size}"), str(tmp_path / "rows.npy"), str(out))
        mp.spawn(_evaluate_on_ranks, args=args, nprocs=world_size)
        losses[world_size] = float(out.read_text())
    assert 4 < losses[1] < 7  # a random model's loss over 257 tokens, near log(257) = 5.55
    assert losses[2] == pytest.approx(losses[1], rel=1e-6) and losses[4] == pytest.approx(losses[1], rel=1e-6)


def test_the_best_evaluation_is_the_latest_of_the_lowest_and_patience_counts_from_the_first():
    """Equal lowest losses: the later is the best (the checkpoint kept of the two), while early
    stopping counts the evaluations since the lowest was first reached (neither went below it);
    a NaN loss ranks last."""
    from training.components.evaluate import best_evaluation, evaluations_since_best

    def history(*losses):
        return [{"step": 10 * (index + 1), "eval_loss": loss} for index, loss in enumerate(losses)] + [
            {"step": 99, "eval_loss": None}
        ]

    assert best_evaluation(history(3.0, 2.0, 2.5, 2.0, 2.7)) == (40, 2.0)
    assert evaluations_since_best(history(3.0, 2.0, 2.5, 2.0, 2.7)) == 3
    assert best_evaluation(history(float("nan"), 4.0)) == (20, 4.0)
    assert evaluations_since_best(history(float("nan"), 4.0)) == 0
    assert best_evaluation(history()) is None and evaluations_since_best(history()) == 0
