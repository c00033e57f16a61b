"""lm_head and cross-entropy fused over chunks of tokens.

With a 151,936-token vocabulary the full logits of a 4096 x 4 batch are 2.5 G
values; the default Hugging Face loss keeps them (and an fp32 copy) alive until
backward. Here each chunk's logits live only while that chunk is processed:
the gradients with respect to the hidden states and the lm_head weight are
computed in the forward pass, so backward only scales them and nothing is
recomputed (the FLOPs stay those of the plain loss).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

IGNORE_INDEX = -100


def chunk_loss_and_logit_grad(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of one chunk and its gradient w.r.t. the logits, math in fp32."""
    logits32 = logits.float()
    valid = labels != ignore_index
    targets = torch.where(valid, labels, 0).unsqueeze(1)
    log_normalizer = torch.logsumexp(logits32, dim=-1, keepdim=True)
    loss_sum = ((log_normalizer - logits32.gather(1, targets)).squeeze(1) * valid).sum()
    grad = torch.exp(logits32 - log_normalizer)
    grad.scatter_add_(1, targets, torch.full_like(targets, -1.0, dtype=grad.dtype))
    grad.mul_(valid.unsqueeze(1))
    return loss_sum, grad.to(logits.dtype)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens, chunk_fn):
        tokens = hidden.shape[0]
        count = (labels != IGNORE_INDEX).sum().clamp(min=1)
        grad_hidden = torch.empty_like(hidden)
        # fp32 accumulator: the chunks' contributions are summed without bf16 rounding.
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, tokens, chunk_tokens):
            end = min(start + chunk_tokens, tokens)
            chunk_hidden = hidden[start:end]
            logits = chunk_hidden @ weight.t()
            chunk_loss, grad_logits = chunk_fn(logits, labels[start:end])
            loss_sum += chunk_loss
            grad_hidden[start:end] = grad_logits @ weight
            grad_weight += grad_logits.t() @ chunk_hidden
        ctx.save_for_backward(grad_hidden, grad_weight, count)
        ctx.weight_dtype = weight.dtype
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight, count = ctx.saved_tensors
        scale = grad_output / count
        return (
            grad_hidden * scale.to(grad_hidden.dtype),
            (grad_weight * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    chunk_fn: Callable[
        [torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
    ] = chunk_loss_and_logit_grad,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden @ weight.T` against `labels` ([tokens, hidden] and [tokens])."""
    return _FusedLinearCrossEntropy.apply(hidden, weight, labels, chunk_tokens, chunk_fn)
