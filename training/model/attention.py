"""The attention kernel a run trains with, and the FlexAttention mask of its isolated documents.

`--attention auto` (the presets' default) is FlexAttention on GPUs where documents are isolated
(`TrainConfig.wanted_attention`). Its Triton kernels are
compiled on the device, and a GPU whose shared memory cannot hold the tiles Inductor picks (an L4
has 99 KiB a block, an H200 227 KiB) fails that compile. So before any model exists a run
compiles flex's forward and backward once on a small problem of the model's head shape: with
torch's own tile sizes, then with the smaller `SMALL_TILES`; if neither compiles it trains with
SDPA and says so in one line, rather than failing in its first step.

With flex, a micro-batch of isolated documents gets one `BlockMask` (causal inside each document),
built on the device by the compiled `create_block_mask` from the document ids `model_batch` made on
the host, and passed to every layer: no host synchronisation, and the blocks it masks out are
never computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from training.config.run_config import TrainConfig
from training.errors import UsageError, first_line

# The BlockMask's block: tokens per query and key block that are skipped or computed together
# (torch's default, which every kernel tile below divides).
FLEX_BLOCK = 128
# Kernel tiles for GPUs with little shared memory (sm_86/sm_89: 99 KiB a block), tried when torch's
# own choice does not compile: forward 64 x 64 in 2 stages (16 KiB of queries and 2 x 32 KiB of keys
# and values at head_dim 128), backward 32 x 64 / 64 x 32.
SMALL_TILES: dict[str, Any] = {
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "num_stages": 2,
    "num_warps": 4,
    "BLOCK_M1": 32,
    "BLOCK_N1": 64,
    "BLOCK_M2": 64,
    "BLOCK_N2": 32,
}
# The tile choices tried in turn: None is torch's own (per GPU generation, head_dim and dtype).
TILE_CHOICES: tuple[dict[str, Any] | None, ...] = (None, SMALL_TILES)


def document_mask_mod(document_ids: torch.Tensor) -> Callable[..., torch.Tensor]:
    """Query q sees key kv when kv is not after q and both lie in one document of row b."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (kv <= q) & (document_ids[b, q] == document_ids[b, kv])

    return mask_mod


def document_block_mask(document_ids: torch.Tensor) -> BlockMask:
    """The causal, per-document BlockMask of [batch, seq] document ids (one id per document of a
    row, rising), built once per micro-batch on their device and shared by every layer and head."""
    batch, seq = document_ids.shape
    return create_block_mask(
        document_mask_mod(document_ids),
        B=batch,
        H=None,
        Q_LEN=seq,
        KV_LEN=seq,
        device=document_ids.device,
        BLOCK_SIZE=FLEX_BLOCK,
        _compile=document_ids.device.type == "cuda",
    )


def flex_compile_error(architecture: Any, device: torch.device, tiles: dict[str, Any] | None) -> str | None:
    """Compile and run FlexAttention's forward and backward once, as the model's layers call it (bf16,
    its query and key-value heads and head_dim, two documents of 256 tokens), with kernel `tiles`;
    None when it ran, else the error's first line."""
    heads = architecture.num_attention_heads
    kv_heads = getattr(architecture, "num_key_value_heads", None) or heads
    head_dim = getattr(architecture, "head_dim", None) or architecture.hidden_size // heads
    seq = 4 * FLEX_BLOCK
    generator = torch.Generator(device=device).manual_seed(0)
    shapes = ((1, heads, seq, head_dim), (1, kv_heads, seq, head_dim), (1, kv_heads, seq, head_dim))
    q, k, v = (
        torch.randn(shape, device=device, dtype=torch.bfloat16, generator=generator).requires_grad_()
        for shape in shapes
    )
    document_ids = (torch.arange(seq, device=device) >= seq // 2).int().unsqueeze(0)
    try:
        compiled = torch.compile(flex_attention, dynamic=False)
        out = compiled(
            q,
            k,
            v,
            block_mask=document_block_mask(document_ids),
            enable_gqa=kv_heads != heads,
            kernel_options=cast(Any, tiles),
        )
        out.float().sum().backward()
        torch.cuda.synchronize(device)
    except Exception as error:  # any compile or launch failure means: not this kernel here
        return f"{type(error).__name__}: {first_line(error)[:200]}"
    return None


def _agreed(ok: bool, device: torch.device) -> bool:
    """Whether every rank's flex compiled: ranks must train alike (the same kernel, the same mask)."""
    if not dist.is_initialized():
        return ok
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def attention_kernel(
    config: TrainConfig, architecture: Any, device: torch.device, warn: Callable[[str], None]
) -> tuple[str, dict[str, Any] | None]:
    """The kernel the run trains with (`sdpa` or `flex`) and flex's kernel tiles (None: torch's).

    `--attention sdpa` is sdpa; `flex` and `auto` on a GPU compile flex first (`TILE_CHOICES` in
    turn). `auto` falls back to sdpa with one `warn` line; `flex`, which the user asked for, stops
    with a one-line `UsageError`. Collective when a process group exists: all ranks agree."""
    wanted = config.wanted_attention
    if wanted == "sdpa" or device.type != "cuda":  # only a flex forward runs off the GPU
        return wanted if config.attention == "flex" else "sdpa", None
    errors = []
    for tiles in TILE_CHOICES:
        error = flex_compile_error(architecture, device, tiles)
        if _agreed(error is None, device):
            return "flex", tiles
        errors.append(error or "another rank's compile failed")
    gpu = torch.cuda.get_device_name(device)
    if config.attention == "flex":
        raise UsageError(
            f"--attention flex: FlexAttention does not compile on {gpu} ({errors[-1]}); use --attention sdpa"
        )
    warn(
        f"warning: --attention auto: FlexAttention does not compile on {gpu} ({errors[-1]}); training "
        "with sdpa, which computes the blocks isolated documents mask out"
    )
    return "sdpa", None
