"""One optimizer step (training/step.py, `train_step`): the divergence check's message, and
gradient accumulation, whose micro-batches over the step's one normaliser give the loss, the
gradients and the updated weights of one step over all their rows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

import training.distributed.parallelize
from tests.harness.accumulated_step import (
    ONE_RANK_MICRO_BATCHES,
    accumulated_step,
    assert_same_step,
    two_rows,
)
from tests.harness.build_session import BuildSession
from training.build import build
from training.config.run_config import parse_args
from training.model.loss import global_normalizer


@pytest.mark.parametrize(
    ("loss", "grad_norm", "quantity", "value"),
    [
        (math.nan, 1.0, "loss", "nan"),
        (math.inf, math.nan, "loss", "inf"),
        (2.5, -math.inf, "gradient norm", "-inf"),
    ],
)
def test_divergence_names_the_step_the_quantity_its_value_and_the_fix(loss, grad_norm, quantity, value):
    from training.step import divergence

    message = divergence(7, loss=loss, grad_norm=grad_norm, lr=3e-3)
    assert message is not None and "\n" not in message
    assert message.startswith(f"step 7: the {quantity} is {value};")
    assert "--lr (this step's: 0.003)" in message and "data" in message and "bf16" in message
    assert divergence(7, loss=2.5, grad_norm=1e30, lr=3e-3) is None


@pytest.fixture
def one_process(monkeypatch):
    """A one-rank gloo group in this process, and fp32 FSDP (exact to rounding)."""
    monkeypatch.setattr(training.distributed.parallelize, "MIXED_PRECISION", MixedPrecisionPolicy())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_micro_batch_losses_over_the_step_normaliser_add_up_to_the_batch_loss(one_process):
    """At the model: two micro-batches of 3 and 32 valid labels, each divided by the step's
    count of 35, give the loss and gradients of one forward over both rows."""
    config = parse_args(["--preset", "tiny"])
    model, _, _, _ = build(config, BuildSession(0, 1, 1, torch.device("cpu")))
    inputs, labels = two_rows()

    whole = model(inputs, labels)
    whole.backward()
    want = {name: param.grad.full_tensor().clone() for name, param in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    normalizer = global_normalizer(labels[:1], labels[1:])
    assert normalizer.item() == 35
    parts = [model(inputs[i : i + 1], labels[i : i + 1], normalizer) for i in (0, 1)]
    for part in parts:
        part.backward()
    torch.testing.assert_close(sum(part.detach() for part in parts), whole.detach(), rtol=1e-5, atol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad.full_tensor(), want[name], rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("defer_grad_sync", [False, True], ids=["sync-per-micro-batch", "deferred-sync"])
def test_an_accumulated_step_matches_one_step_over_all_its_rows(one_process, defer_grad_sync):
    """Through the loop's train_step: micro-batches of 1 and 3 rows against one batch of 4,
    reducing after each micro-batch or once per step."""
    accumulated = accumulated_step(0, 1, ONE_RANK_MICRO_BATCHES[0], defer_grad_sync)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    whole = accumulated_step(0, 1, [slice(0, 4)])
    assert_same_step(accumulated, whole)
