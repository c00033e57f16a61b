"""Flex on grouped key-value heads (bench/train_bench/grouped_flex.py), the bench's measured and
rejected variant: the same attention as the job's flex path, which copies the heads."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from bench.train_bench import grouped_flex
from training.model.attention import document_block_mask


@pytest.fixture
def eager_flex(monkeypatch):
    """Flex uncompiled (the CPU forward; no 13 s compile)."""
    monkeypatch.setattr(grouped_flex, "_compiled_flex", lambda: flex_attention)


def test_grouped_flex_gives_the_attention_of_each_query_heads_own_key_value_head(eager_flex):
    """Six query heads on two key-value heads (no power of two, where transformers' flex path
    copies them), documents of unaligned lengths: the grouped call equals float64 attention over the
    dense document mask with query head h reading key-value head h // 3, and flex on the copied
    heads; reading head h % 2 instead (a wrong grouping) does not."""
    generator = torch.Generator().manual_seed(0)
    lengths, heads, kv_heads, head_dim = (150, 70, 36), 6, 2, 16
    seq = sum(lengths)
    document_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths)).int().expand(2, seq)
    q = torch.randn(2, heads, seq, head_dim, generator=generator)
    k, v = (torch.randn(2, kv_heads, seq, head_dim, generator=generator) for _ in range(2))
    module = torch.nn.Module()
    mask = document_block_mask(document_ids)
    grouped, weights = grouped_flex.grouped_flex_attention(module, q, k, v, mask, scaling=0.3)
    assert weights is None and grouped.shape == (2, seq, heads, head_dim)
    copied, _ = grouped_flex.grouped_flex_attention(
        module, q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), mask, scaling=0.3
    )
    allowed = (document_ids[0][:, None] == document_ids[0][None, :]) & torch.ones(seq, seq).tril().bool()

    def dense(k_heads: torch.Tensor, v_heads: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k_heads.double(), v_heads.double(), attn_mask=allowed, scale=0.3
        )
        return out.transpose(1, 2).float()

    reference = dense(k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1))
    torch.testing.assert_close(grouped, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped, copied, rtol=1e-6, atol=1e-6)
    wrong = dense(k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1))
    assert (grouped - wrong).abs().max() > 0.1


def test_the_bench_puts_the_grouped_call_under_the_flex_name_for_the_block_only():
    from transformers import AttentionInterface

    from training.config.settings import ATTENTION_KERNELS

    name = ATTENTION_KERNELS["flex"]
    original = AttentionInterface._global_mapping[name]
    with grouped_flex.grouped_flex():
        assert AttentionInterface._global_mapping[name] is grouped_flex.grouped_flex_attention
    assert AttentionInterface._global_mapping[name] is original


def test_grouped_flex_refuses_a_mask_that_is_no_block_mask():
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="takes a FlexAttention BlockMask, not NoneType"):
        grouped_flex.grouped_flex_attention(torch.nn.Module(), q, q, q, None)
