"""The loops' shapes: the tuned and naive variants, the rows of isolated documents, and MFU counted
as causal and on the attention the mask leaves."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.train_bench.session import benchmark_config
from training.config.run_config import BYTE_TOKENIZER, TrainConfig
from training.data.packing import DOCUMENT_START
from training.metrics.flops import attended_share, flops_per_token, mfu
from training.model.attention import FLEX_BLOCK

# Documents a row in the isolated variants: 512 tokens each at seq 4096, an instruction-tuning
# length (the rows of bench/reports/flex-attention_h200_202612.md, `h200-document-attention-compiled`).
DOCUMENTS_PER_ROW = 8

TUNED_VARIANTS: dict[str, dict[str, Any]] = {
    "tuned-eager-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": False},
    "tuned-compiled-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True},
    "tuned-compiled-4096x8": {"seq_len": 4096, "batch_size": 8, "compile": True},
    "tuned-compiled-4096x6": {"seq_len": 4096, "batch_size": 6, "compile": True},
    "tuned-compiled-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True},
    "tuned-compiled-8192x4": {"seq_len": 8192, "batch_size": 4, "compile": True},
    "tuned-compiled-4096x16": {"seq_len": 4096, "batch_size": 16, "compile": True},
    # Gradient accumulation: 2 or 4 micro-batches of 12 sequences per optimizer step, and 2, 4
    # or 8 micro-batches of 10 or 12 with the reduce deferred to the last (--defer-grad-sync).
    **{
        f"tuned-compiled-accum{steps}-4096x12": {
            "seq_len": 4096,
            "batch_size": 12,
            "compile": True,
            "grad_accum_steps": steps,
        }
        for steps in (2, 4)
    },
    **{
        f"tuned-compiled-accum{steps}-deferred-4096x{batch}": {
            "seq_len": 4096,
            "batch_size": batch,
            "compile": True,
            "grad_accum_steps": steps,
            "defer_grad_sync": True,
        }
        for steps in (2, 4, 8)
        for batch in (10, 12)
    },
    # Isolated documents (DOCUMENTS_PER_ROW a row) with FlexAttention, the GPU default, in the
    # shapes of the fastest causal loops; and with SDPA, which computes the masked blocks.
    **{
        f"tuned-compiled-isolated-{kernel}-4096x12": {
            "seq_len": 4096,
            "batch_size": 12,
            "compile": True,
            "attention": kernel,
            "documents": DOCUMENTS_PER_ROW,
        }
        for kernel in ("flex", "sdpa")
    },
    # Flex on the key-value heads as they are (bench/train_bench/grouped_flex.py), against the job's
    # flex path, which copies them to the query heads' count; and the isolated-flex loop at 4 to 6
    # rows (6: the most an 80 GiB GPU holds).
    **{
        f"tuned-compiled-isolated-flex{grouped}-4096x{batch}": {
            "seq_len": 4096,
            "batch_size": batch,
            "compile": True,
            "attention": "flex",
            "documents": DOCUMENTS_PER_ROW,
            **({"grouped_kv": True} if grouped else {}),
        }
        for grouped in ("", "-grouped-kv")
        for batch in (4, 5, 6, 12)
        if (grouped, batch) != ("", 12)  # declared above with the SDPA one
    },
    "tuned-compiled-accum8-deferred-isolated-flex-4096x10": {
        "seq_len": 4096,
        "batch_size": 10,
        "compile": True,
        "grad_accum_steps": 8,
        "defer_grad_sync": True,
        "attention": "flex",
        "documents": DOCUMENTS_PER_ROW,
    },
    # The levers of bench/reports/mfu_h100_202612.md at an 80 GiB GPU's 6 rows and a 141 GiB one's 12
    # (and the H200 record's accumulation): torch's AdamW on the DTensors (the job's optimizer before
    # it stepped the local shards), and 2 or 4 micro-batches a step, reduced after each or deferred
    # to the last (which keeps the whole model's fp32 gradients and gathered weights: fewer rows).
    **{
        f"tuned-compiled-isolated-flex-dtensor-adamw-4096x{batch}": {
            "seq_len": 4096,
            "batch_size": batch,
            "compile": True,
            "attention": "flex",
            "documents": DOCUMENTS_PER_ROW,
            "dtensor_adamw": True,
        }
        for batch in (6, 12)
    },
    **{
        f"tuned-compiled-accum{steps}{'-deferred' if deferred else ''}-isolated-flex-4096x{batch}": {
            "seq_len": 4096,
            "batch_size": batch,
            "compile": True,
            "grad_accum_steps": steps,
            "defer_grad_sync": deferred,
            "attention": "flex",
            "documents": DOCUMENTS_PER_ROW,
        }
        for steps in (2, 4, 8)
        for deferred, batch in ((False, 6), (False, 5), (True, 5), (True, 4))
    },
    "tuned-compiled-float8-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True, "float8": True},
    "tuned-compiled-float8-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True, "float8": True},
}
# The H200 record's accumulation with torch's AdamW on the DTensors.
TUNED_VARIANTS["tuned-compiled-accum8-deferred-isolated-flex-dtensor-adamw-4096x10"] = {
    **TUNED_VARIANTS["tuned-compiled-accum8-deferred-isolated-flex-4096x10"],
    "dtensor_adamw": True,
}
# Run unless --variants names others. The variants measured and left out are in
# bench/reports/rejected-variants_h200_202612.md.
DEFAULT_VARIANTS = [
    "tuned-eager-4096x4",
    "tuned-compiled-4096x4",
    "tuned-compiled-4096x8",
    "tuned-compiled-4096x12",
    "tuned-compiled-accum2-4096x12",
    "tuned-compiled-accum4-4096x12",
    "tuned-compiled-accum4-deferred-4096x10",
    "tuned-compiled-accum4-deferred-4096x12",
    "tuned-compiled-accum8-deferred-4096x10",
    "tuned-compiled-float8-4096x4",
    "tuned-compiled-float8-4096x12",
]
# Keys of a variant that are not TrainConfig fields but the benchmark's own.
BENCH_KEYS = ("documents", "grouped_kv", "dtensor_adamw")
NAIVE_VARIANTS: dict[str, dict[str, Any]] = {
    "naive-eager-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": False},
    "naive-compiled-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True},
    # For 80 GiB GPUs (an H100), where the naive loop's 4 rows need 86 GiB.
    "naive-compiled-4096x2": {"seq_len": 4096, "batch_size": 2, "compile": True},
}


def tuned_config(model_config: str, steps: int, spec: dict[str, Any]) -> TrainConfig:
    """One GPU has memory to spare: no recompute, and layers stay gathered for backward."""
    overrides = {key: value for key, value in spec.items() if key not in BENCH_KEYS}
    # Rows of isolated documents come from the session (`documents_rows`), as a corpus of ids.
    corpus = {"data": DOCUMENT_ROWS, "tokenizer": BYTE_TOKENIZER} if spec.get("documents") else {}
    return benchmark_config(
        model_config,
        steps,
        **{
            "reshard_after_forward": False,
            "hsdp_replicas": 1,
            "activation_checkpointing": False,
            "attention": "sdpa",  # the causal loops' cuDNN kernel, as every earlier measurement
            **corpus,
            **overrides,
        },
    )


# The `data` of a variant trained on `documents_rows` (the session hands them over).
DOCUMENT_ROWS = "bench-document-rows"


def documents_rows(rows: int, seq_len: int, documents: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """Stored rows of random ids, each row `documents` isolated documents of seq_len / documents
    tokens (a DOCUMENT_START flag at each one's first token)."""
    generator = np.random.default_rng(seed)
    stored = generator.integers(0, vocab_size, size=(rows, seq_len + 1), dtype=np.int32)
    stored[:, : seq_len + 1 : seq_len // documents] |= DOCUMENT_START
    return stored


def attention_shares(spec: dict[str, Any]) -> dict[str, float]:
    """How much of the seq × seq score matrix a variant's mask leaves: `attended` query-key pairs
    (causal inside each document), and for flex the `blocks` of FLEX_BLOCK² its kernel computes."""
    seq, documents = spec["seq_len"], spec.get("documents", 1)
    length = seq // documents
    shares = {"attended": attended_share([[length] * documents], seq)}
    if spec.get("attention") == "flex" and length % FLEX_BLOCK == 0:
        # Each document's blocks on and below its diagonal; the diagonal ones are computed whole.
        per_document = length // FLEX_BLOCK
        shares["blocks"] = documents * per_document * (per_document + 1) / 2 / (seq // FLEX_BLOCK) ** 2
    return shares


def mfu_counts(
    architecture: Any, spec: dict[str, Any], tokens_per_s: float, peak: float | None
) -> dict[str, Any]:
    """MFU two ways: `mfu` counts attention as over the whole causal row, 12·L·H·S per token, as
    every earlier measurement (and `mfu_causal` half that); `mfu_done` counts the attention FLOPs the
    mask leaves (the pairs inside each document: the masked blocks skipped)."""
    shares = attention_shares(spec)
    seq = spec["seq_len"]
    return {
        "mfu_done": mfu(tokens_per_s, flops_per_token(architecture, seq, attended=shares["attended"]), peak),
        "attended_share": shares["attended"],
        "flex_blocks_share": shares.get("blocks"),
    }
