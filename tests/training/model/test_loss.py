"""lm_head and cross-entropy fused over chunks of tokens: the loss and gradients of the full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.model.loss import (
    IGNORE_INDEX,
    chunk_loss_and_logit_grad,
    chunk_loss_and_logit_grad_fusable,
    fused_linear_cross_entropy,
    global_normalizer,
)


@pytest.mark.parametrize("tokens, chunk", [(37, 8), (64, 64), (50, 1000)])
def test_fused_loss_matches_full_logits(tokens, chunk):
    generator = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 16, generator=generator, requires_grad=True)
    weight = torch.randn(40, 16, generator=generator, requires_grad=True)
    labels = torch.randint(0, 40, (tokens,), generator=generator)
    labels[::5] = IGNORE_INDEX

    expected = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE_INDEX)
    expected_grads = torch.autograd.grad(expected * 3, (hidden, weight))
    for chunk_fn in (chunk_loss_and_logit_grad, chunk_loss_and_logit_grad_fusable):
        fused = fused_linear_cross_entropy(hidden, weight, labels, global_normalizer(labels), chunk, chunk_fn)
        fused_grads = torch.autograd.grad(fused * 3, (hidden, weight))

        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6)
        for got, want in zip(fused_grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bf16_gradients_carry_an_unrounded_scale():
    """1/3 is 0.3340 in bf16 (+0.2%): applied to the bf16 hidden-state gradient it would bias
    every element by that much. Scaled in fp32 before the cast, only unbiased rounding is left."""
    assert abs(torch.tensor(1 / 3).to(torch.bfloat16).item() * 3 - 1) > 1e-3
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(48, 256, generator=generator).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(64, 256, generator=generator) * 0.1).to(torch.bfloat16).requires_grad_()
    labels = torch.full((48,), IGNORE_INDEX)
    labels[:3] = torch.tensor([5, 17, 40])  # three valid labels: the loss divides by 3

    fused = fused_linear_cross_entropy(hidden, weight, labels, global_normalizer(labels), 16)
    hidden64, weight64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    expected = F.cross_entropy(hidden64 @ weight64.t(), labels, ignore_index=IGNORE_INDEX)
    for got, want in zip(
        torch.autograd.grad(fused, (hidden, weight)),
        torch.autograd.grad(expected, (hidden64, weight64)),
        strict=True,
    ):
        got = got.double()
        # The least-squares ratio of got to want: 1 up to rounding noise, not 1.002.
        ratio = (got * want).sum() / (want * want).sum()
        assert abs(ratio.item() - 1) < 5e-4
