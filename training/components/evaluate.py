"""Held-out evaluation: the training loss's definition on rows the model never trains on.

The fused loss computes its gradients in the forward pass; under `torch.no_grad` it takes
its gradient-free path (training/model/loss.py), so an evaluation costs forwards only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.data.packing import batches_per_epoch
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX


def eval_batches(rows: np.ndarray, *, rank: int, world_size: int, batch_size: int) -> list[np.ndarray]:
    """This rank's [batch, seq_len + 1] int64 batches of the held-out rows, in corpus order, row i
    to rank i mod world size. The rows that do not fill a global batch are left out, so every
    rank runs as many forwards (FSDP's all-gathers are collective). ValueError when the rows
    cannot fill one global batch."""
    batches = batches_per_epoch(
        len(rows), world_size=world_size, batch_size=batch_size, seq_len=rows.shape[1] - 1
    )
    mine = rows[: batches * batch_size * world_size][rank::world_size]
    return [mine[index * batch_size : (index + 1) * batch_size].astype(np.int64) for index in range(batches)]


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
