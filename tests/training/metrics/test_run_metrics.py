"""The run's metrics on the training side: perplexity from the loss, and the tokens a step counts."""

from __future__ import annotations

import math

import pytest
import torch

from training.config.run_config import parse_args
from training.metrics.run_metrics import perplexity


def test_perplexity_is_exp_of_the_loss_and_infinite_past_a_float():
    assert perplexity(math.log(20.0)) == pytest.approx(20.0)
    assert perplexity(1000.0) == math.inf


def test_tokens_per_step_count_every_micro_batch():
    from training.metrics.run_metrics import RunMetrics
    from training.model.causal_lm import load_architecture

    config = parse_args(["--grad-accum-steps", "4"])
    metrics = RunMetrics(config, load_architecture(config), torch.device("cpu"), 2, 0)
    assert metrics.tokens_per_step == 8 * 128 * 2 * 4
    record = metrics.step(1, 2.0, 0.5, 100, 8 * 128 * 129 // 2, lr=1e-3, grad_norm=1.0, eval_loss=None)
    assert record.tokens_per_s == 8 * 128 * 2 * 4 / 0.5 and record.tokens_per_s_per_gpu == 8 * 128 * 4 / 0.5


def test_the_summary_counts_mfu_done_over_the_pairs_the_documents_attend(one_rank_group):
    """Rows of two 64-token documents attend 2 x 64·65/2 of the 128² scores: `mfu_done` counts
    attention's FLOPs over that share (the bench's `mfu_done` for such rows), `mfu` over all of it."""
    from training.metrics.flops import attended_share, flops_per_token, mfu
    from training.metrics.run_metrics import RunMetrics
    from training.model.causal_lm import load_architecture

    config = parse_args(["--preset", "tiny", "--seq-len", "128", "--batch-size", "8"])
    architecture = load_architecture(config)
    metrics = RunMetrics(config, architecture, torch.device("cpu"), 1, 0)
    metrics.peak = 989e12  # an H100's, as a CUDA device would name it: the CPU has none
    pairs_per_row = 2 * 64 * 65 // 2
    for step, seconds in ((1, 9.0), (2, 0.5), (3, 0.5)):
        metrics.step(step, 2.0, seconds, 1000, 8 * pairs_per_row, lr=1e-3, grad_norm=1.0, eval_loss=None)
    summary = metrics.summary(1, resharded=False)
    share = attended_share([[64, 64]], 128)
    assert summary.attended_share == pytest.approx(share) == pytest.approx(pairs_per_row / 128**2)
    per_gpu = 8 * 128 / 0.5
    assert summary.mfu_done == pytest.approx(
        mfu(per_gpu, flops_per_token(architecture, 128, attended=share), 989e12)
    )
    assert summary.mfu == pytest.approx(mfu(per_gpu, flops_per_token(architecture, 128), 989e12))
    assert summary.mfu_done < summary.mfu_causal < summary.mfu
