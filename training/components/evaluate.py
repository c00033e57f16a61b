"""Held-out evaluation: the training loss's definition on rows the model never trains on.

The fused loss computes its gradients in the forward pass; under `torch.no_grad` it takes
its gradient-free path (training/model/loss.py), so an evaluation costs forwards only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.data.packing import NO_LOSS
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX


def eval_batches(rows: np.ndarray, *, rank: int, world_size: int, batch_size: int) -> list[np.ndarray]:
    """This rank's [batch, seq_len + 1] int64 batches of the held-out rows, in corpus order, row i
    to rank i mod world size. Every row is evaluated once: the last global batch is filled with
    rows that carry no loss (every token NO_LOSS), so the loss is over the same labels whatever
    the world size and batch size, and every rank runs as many forwards (FSDP's all-gathers are
    collective). ValueError when there are no rows."""
    if not len(rows):
        raise ValueError(f"the corpus packs into no rows of {rows.shape[1]} tokens: nothing to evaluate")
    global_batch = batch_size * world_size
    batches = -(-len(rows) // global_batch)
    mine = np.full((batches * batch_size, rows.shape[1]), NO_LOSS, dtype=np.int64)
    own = rows[rank::world_size]
    mine[: len(own)] = own
    return [mine[index * batch_size : (index + 1) * batch_size] for index in range(batches)]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Sequence[np.ndarray], device: torch.device) -> float:
    """The mean cross-entropy over every valid label of all ranks' batches, as a training step's
    loss is over its global batch. Collective: one all-reduce of the summed loss and label count."""
    was_training = model.training
    model.eval()
    unit = torch.ones((), dtype=torch.float32, device=device)  # the normaliser: summed, not averaged
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for rows in batches:
        batch = model_batch(rows, device)  # the labels and positions a training step would take
        loss_sum = model(batch.input_ids, batch.labels, unit, batch.position_ids, batch.document_ids)
        totals += torch.stack([loss_sum.double(), (batch.labels != IGNORE_INDEX).sum().double()])
    model.train(was_training)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    loss_sum, count = totals.tolist()
    return loss_sum / max(count, 1.0)


def _evaluations(history: Sequence[dict[str, Any]]) -> list[tuple[float, int]]:
    """(eval_loss, step) of each evaluation, in order; a NaN loss as infinite, the worst."""
    return [
        (math.inf if math.isnan(entry["eval_loss"]) else entry["eval_loss"], entry["step"])
        for entry in history
        if entry.get("eval_loss") is not None
    ]


def best_evaluation(history: Sequence[dict[str, Any]]) -> tuple[int, float] | None:
    """The step of the lowest eval_loss in a run's history (the latest of equal ones, as the
    checkpoints kept are: `training.components.checkpoint.checkpoints_kept`) and that loss; None
    without an evaluation."""
    evaluated = _evaluations(history)
    if not evaluated:
        return None
    lowest = min(loss for loss, _ in evaluated)
    return max(step for loss, step in evaluated if loss == lowest), lowest


def evaluations_since_best(history: Sequence[dict[str, Any]]) -> int:
    """How many evaluations came after the first that reached the lowest eval_loss: none of
    them went below it."""
    losses = [loss for loss, _ in _evaluations(history)]
    return len(losses) - 1 - losses.index(min(losses)) if losses else 0
