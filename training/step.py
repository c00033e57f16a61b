"""One optimizer step, the same under every launcher: forward and backward over the step's
micro-batches with one loss normaliser, one clip, the step's one host sync (the loss, the gradient
norm and the components' ballot in one all-reduce), the divergence check, then the optimizer.
`training.loop` runs it once per step; the bench and the tests run it alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from training.components.deadline import Deadline
from training.components.optim import set_learning_rate
from training.distributed.ballot import StepBallot, step_sync
from training.errors import DivergedError
from training.model.causal_lm import CausalLMWithFusedLoss, ModelBatch
from training.model.loss import global_normalizer


def divergence(step: int, *, loss: float, grad_norm: float, lr: float) -> str | None:
    """Why the run must stop at `step` (its loss or gradient norm is not finite), or None."""
    for name, value in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(value):
            return (
                f"step {step}: the {name} is {value}; stopped before this step's optimizer step and "
                f"checkpoint. Lower --lr (this step's: {lr:g}), or check the data and for bf16 overflow"
            )
    return None


def train_step(
    model: CausalLMWithFusedLoss,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[ModelBatch],
    lr: float,
    max_grad_norm: float,
    defer_grad_sync: bool = False,
    *,
    step: int,
    ballot: StepBallot | None = None,
    deadline: Deadline | None = None,
) -> tuple[float, float]:
    """Optimizer step `step` on micro-batches (`model_batch` of stored rows; forward and
    backward each in turn, then one clip and one optimizer step); returns the step's loss,
    the sum of the micro-batch losses averaged over the ranks, and the gradient norm before
    clipping. A non-finite loss or gradient
    norm raises `DivergedError` on every rank before the optimizer step touches the weights.
    `ballot`: the components' counts, summed over the ranks on the step's all-reduce
    (`training.distributed.ballot.step_sync`); with `deadline`, this rank's vote to stop after
    this step is cast on it just before, when the step's time is known."""
    set_learning_rate(optimizer, lr)
    # One normaliser for the whole step: each micro-batch's summed loss over the step's
    # valid-label count, so the accumulated gradient is that of the step's token mean.
    normalizer = global_normalizer(*(batch.labels for batch in micro_batches))
    losses = []
    for index, batch in enumerate(micro_batches):
        # By default FSDP2 reduce-scatters after every micro-batch's backward and sums into the
        # sharded fp32 .grad. With defer_grad_sync the micro-batches before the last keep their
        # gradients unsharded (fp32, the whole model's size on every rank) and the layers stay
        # gathered from one backward into the next forward: one reduce-scatter per step.
        last = index == len(micro_batches) - 1
        if defer_grad_sync:
            sharded = cast(FSDPModule, model)  # what `parallelize`'s fully_shard made of it
            sharded.set_requires_gradient_sync(last)
            sharded.set_reshard_after_backward(last)
        loss = model(batch.input_ids, batch.labels, normalizer, batch.position_ids, batch.document_ids)
        loss.backward()
        losses.append(loss.detach())
    # The total norm of FSDP2's sharded gradients is a replicated DTensor: one global value.
    # Without clipping it is computed for the check alone (a pass over the gradients and an
    # all-reduce of one number, queued on the device: no host sync).
    if max_grad_norm:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # The step's one sync: the host reads the loss and the gradient norm here, before the optimizer
    # step, so a non-finite step stops before it reaches the weights. The host waits for the
    # backward, then queues the optimizer step and builds the next batch while the device runs it.
    # Both values are all-reduced, so every rank decides alike and none is left waiting in a
    # collective.
    ballot = ballot if ballot is not None else StepBallot()
    if deadline is not None:
        deadline.cast(ballot)
    step_loss, norm = step_sync(torch.stack(losses).sum(), cast(DTensor, grad_norm).full_tensor(), ballot)
    problem = divergence(step, loss=step_loss, grad_norm=norm, lr=lr)
    if problem:
        raise DivergedError(problem)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, norm
