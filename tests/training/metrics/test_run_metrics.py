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
    record = metrics.step(1, 2.0, 0.5, 100, lr=1e-3, grad_norm=1.0, eval_loss=None)
    assert record.tokens_per_s == 8 * 128 * 2 * 4 / 0.5 and record.tokens_per_s_per_gpu == 8 * 128 * 4 / 0.5
