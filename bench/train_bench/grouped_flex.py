"""FlexAttention on grouped key-value heads, measured against the job's flex path and left out.

Transformers' flex path (the job's `--attention flex`) copies Qwen2.5's 2 key-value heads to its 12
query heads whenever the query heads are no power of two, and keeps the copies for backward.
`grouped_flex_attention` passes the key-value heads as they are (`enable_gqa`): the same attention
(tests/bench/train_bench/test_grouped_flex.py; `python -m bench.flex_checks --checks grouped-heads`
on a GPU) in 3.3 GiB less at 4096 x 6, but 9% fewer tokens/s with torch 2.11's kernels
(bench/reports/gqa-flex_h100_202612.md). `grouped_flex()` puts it under transformers' flex name for
one bench variant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from training.config.settings import ATTENTION_KERNELS

_COMPILED_FLEX: Callable[..., Any] | None = None


def _compiled_flex() -> Callable[..., Any]:
    """flex_attention compiled once for calls made outside a compiled layer, as transformers does:
    run as it is, flex computes every score of the row."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


def grouped_flex_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: BlockMask | torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: FlexAttention over [batch, heads, seq, head_dim] queries
    and the key-value heads as they are (`enable_gqa` when fewer), under the layer's BlockMask and
    the `kernel_options` the model passes; [batch, seq, heads, head_dim] out, no weights."""
    if not isinstance(attention_mask, BlockMask):
        raise ValueError(
            f"grouped_flex_attention takes a FlexAttention BlockMask, not {type(attention_mask).__name__}"
        )
    if dropout:
        raise ValueError("grouped_flex_attention has no dropout: set the config's attention_dropout to 0")
    flex = cast(Callable[..., Any], flex_attention) if torch.compiler.is_compiling() else _compiled_flex()
    out = flex(
        query,
        key,
        value,
        block_mask=attention_mask,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
        kernel_options=kwargs.get("kernel_options"),
    )
    return cast(torch.Tensor, out).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def grouped_flex() -> Iterator[None]:
    """`grouped_flex_attention` under the job's flex name while the block runs, transformers' after."""
    from transformers import AttentionInterface

    name = ATTENTION_KERNELS["flex"]
    original = cast(Callable[..., Any], AttentionInterface._global_mapping[name])
    AttentionInterface.register(name, cast(Callable[..., Any], grouped_flex_attention))
    try:
        yield
    finally:
        AttentionInterface.register(name, original)
