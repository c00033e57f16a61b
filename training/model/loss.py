"""lm_head and cross-entropy fused over chunks of tokens, normalised over the global batch.

With a 151,936-token vocabulary the full logits of a 4096 x 4 batch are 2.5 G
values; the default Hugging Face loss keeps them (and an fp32 copy) alive until
backward. Here each chunk's logits live only while that chunk is processed:
the gradients with respect to the hidden states and the lm_head weight are
computed in the forward pass, so backward only scales them and nothing is
recomputed (the FLOPs stay those of the plain loss).

The loss is the mean over every valid label of the global batch, not the mean
of per-rank means: the valid-label count is summed over the data-parallel
ranks before dividing, so ranks with more padding weigh less. With gradient
accumulation the count also spans the step's micro-batches: each micro-batch's
summed loss is divided by the whole step's count, so the micro-batch losses
(and their gradients) add up to those of the step's token mean.

A term on the hidden states (or on the loss value) is a `LossTerm`, added to this loss with plain
autograd (`CausalLMWithFusedLoss.loss_terms`); a term on the logits goes into both chunk functions
and the evaluation's form, with its gradient derived by hand: docs/training/changing-the-loss.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

IGNORE_INDEX = -100

ChunkFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# A term added to the fused loss: (hidden [tokens, hidden], labels [tokens], normalizer) -> a
# scalar, differentiated by autograd. Summed over the valid labels and divided by `normalizer`, as
# the cross-entropy is, it accumulates over micro-batches and ranks as the loss does.
LossTerm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# cuBLAS can add a bf16 product into an fp32 matrix in one call (torch >= 2.8, CUDA only).
_ADDMM_INTO_FP32 = hasattr(torch.ops.aten.addmm, "dtype")


def _chunk_log_probs_and_loss(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fp32 log-probabilities of one chunk, its summed cross-entropy over the valid labels,
    the valid mask and the targets: the loss's one definition, for training and evaluation."""
    valid = labels != IGNORE_INDEX
    targets = torch.where(valid, labels, 0).unsqueeze(1)
    log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    loss_sum = -(log_probs.gather(1, targets).squeeze(1) * valid).sum()
    return log_probs, loss_sum, valid, targets


def chunk_loss_and_logit_grad(
    logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of one chunk and `scale` x its gradient w.r.t. the logits.

    Math in fp32, written for eager mode: few passes over the [tokens, vocab] logits
    (log-softmax, exp in place, one scaled cast to the logits' dtype).
    """
    log_probs, loss_sum, valid, targets = _chunk_log_probs_and_loss(logits, labels)
    grad = log_probs.exp_()
    grad.scatter_add_(1, targets, torch.full_like(targets, -1.0, dtype=grad.dtype))
    row_scale = (valid * scale).unsqueeze(1)
    return loss_sum, torch.mul(grad, row_scale, out=torch.empty_like(logits))


def chunk_loss_and_logit_grad_fusable(
    logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same function written for torch.compile: the one-hot comparison instead of a
    scatter lets Inductor emit one kernel that reads the logits twice and writes the
    gradient once."""
    valid = labels != IGNORE_INDEX
    targets = torch.where(valid, labels, 0).unsqueeze(1)
    logits32 = logits.float()
    log_normalizer = torch.logsumexp(logits32, dim=-1, keepdim=True)
    loss_sum = ((log_normalizer - logits32.gather(1, targets)).squeeze(1) * valid).sum()
    vocab = torch.arange(logits.shape[1], device=logits.device)
    one_hot = (vocab.unsqueeze(0) == targets).to(torch.float32)
    grad = (torch.exp(logits32 - log_normalizer) - one_hot) * (valid * scale).unsqueeze(1)
    return loss_sum, grad.to(logits.dtype)


def global_normalizer(*labels: torch.Tensor) -> torch.Tensor:
    """What each rank divides its summed loss by: the valid-label count of `labels` (one
    tensor per micro-batch of the step) summed over the ranks.

    FSDP averages gradients over the data-parallel ranks (it divides their sum by the world
    size), so dividing each rank's sum by count/world_size makes the averaged gradient that of
    the global token mean. One all-reduce per step, on the device: no host synchronisation.
    """
    count = torch.stack([(part != IGNORE_INDEX).sum() for part in labels]).sum().to(torch.float32)
    world_size = 1
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        if world_size > 1:
            dist.all_reduce(count)
    return count.clamp(min=1) / world_size


def _accumulate(total: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> None:
    """total (fp32) += left @ right (bf16), without rounding the product to bf16 first.

    In place (`out=total`): no temporary the size of the fp32 lm_head, and no copy of it per
    chunk (5 ms of kernel time per 4096 x 12 step on an H200 in
    bench/reports/profile_h200_202612.md; the step time did not measurably change)."""
    if _ADDMM_INTO_FP32 and total.is_cuda and left.dtype != total.dtype:
        torch.addmm(total, left, right, out_dtype=total.dtype, out=total)
    else:
        total += left @ right


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, normalizer, chunk_tokens, chunk_fn):
        tokens = hidden.shape[0]
        # The 1/normalizer scale is applied in fp32 to the logit gradients before they are
        # rounded to bf16, so neither gradient carries a bf16-rounded scale.
        scale = 1.0 / normalizer
        grad_hidden = torch.empty_like(hidden)
        # fp32 accumulator: the chunks' contributions are summed without bf16 rounding.
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, tokens, chunk_tokens):
            end = min(start + chunk_tokens, tokens)
            chunk_hidden = hidden[start:end]
            logits = chunk_hidden @ weight.t()
            chunk_loss, grad_logits = chunk_fn(logits, labels[start:end], scale)
            loss_sum += chunk_loss
            grad_hidden[start:end] = grad_logits @ weight
            _accumulate(grad_weight, grad_logits.t(), chunk_hidden)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss_sum * scale

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output.float()
        return (
            (grad_hidden.float() * scale).to(grad_hidden.dtype),
            (grad_weight * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
        )


def _linear_cross_entropy_without_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    normalizer: torch.Tensor,
    chunk_tokens: int,
) -> torch.Tensor:
    """The same loss for evaluation: the fused forward would compute (and keep) the gradients."""
    loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_tokens):
        end = min(start + chunk_tokens, hidden.shape[0])
        loss_sum += _chunk_log_probs_and_loss(hidden[start:end] @ weight.t(), labels[start:end])[1]
    return loss_sum * (1.0 / normalizer)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    normalizer: torch.Tensor,
    chunk_tokens: int,
    chunk_fn: ChunkFn = chunk_loss_and_logit_grad,
) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T` against `labels` ([tokens, hidden] and [tokens]),
    summed and divided by `normalizer` (see `global_normalizer`). With gradients off (evaluation)
    it computes no gradients and uses the eager chunk function whatever `chunk_fn` is."""
    if not torch.is_grad_enabled():
        return _linear_cross_entropy_without_grad(hidden, weight, labels, normalizer, chunk_tokens)
    return _FusedLinearCrossEntropy.apply(hidden, weight, labels, normalizer, chunk_tokens, chunk_fn)
