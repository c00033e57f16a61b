"""Training throughput and memory benchmark for one GPU, in one process.

Runs, on the Qwen2.5-1.5B architecture with random weights: (1) the loop of
AWS's EKS + Ray Train reference sample (its train.py: pure bf16 weights, plain
AdamW, the Hugging Face loss, seq 128 x batch 1); (2) a naive FSDP2 loop (bf16
mixed precision, the Hugging Face loss, default AdamW), eager and compiled, as
the baseline a tuned loop must beat; (3) our tuned loop, `training.loop.train`
itself, in several shapes, on causal rows and on rows of isolated documents (FlexAttention,
the GPU default, or SDPA), with MFU counted as causal and on the attention done; and (4) the
candidates for the `throughput` preset
at world size 8, emulated with torch's fake process group (collectives are
no-ops, every buffer is allocated as on a real rank): per-rank peak memory
and per-rank tokens/s. It also checks the fused loss against the plain one, and with
--flex-parity-steps trains isolated documents of a real corpus with SDPA and with flex from
one seed and compares the losses.
One JSON line per result, a table last, and all of it in --out.

    python -m bench.train_bench --out bench/results/h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import itertools
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from training.config.run_config import BYTE_TOKENIZER, PRESETS, TrainConfig
from training.data.corpus_cache import in_process_corpus, in_process_rows
from training.data.packing import DOCUMENT_START, PackedCorpus
from training.loop import build, train, train_step
from training.metrics.flops import attended_share, flops_per_token, mfu, num_params, peak_flops
from training.metrics.run_metrics import GIB
from training.model.attention import FLEX_BLOCK
from training.model.causal_lm import load_architecture, model_batch
from training.model.loss import (
    IGNORE_INDEX,
    chunk_loss_and_logit_grad,
    chunk_loss_and_logit_grad_fusable,
    fused_linear_cross_entropy,
    global_normalizer,
)

# Documents a row in the isolated variants: 512 tokens each at seq 4096, an instruction-tuning
# length (the rows of bench/results/h200-document-attention-compiled.json).
DOCUMENTS_PER_ROW = 8

# Liger Kernel's Triton replacements (GPU only): the decoder layer's parts, and its fused
# lm_head + cross-entropy in place of training.model.loss's.
LIGER_LAYER = ("rope", "rms_norm", "swiglu")

TUNED_VARIANTS: dict[str, dict[str, Any]] = {
    "tuned-eager-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": False},
    "tuned-compiled-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True},
    "tuned-compiled-4096x8": {"seq_len": 4096, "batch_size": 8, "compile": True},
    "tuned-compiled-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True},
    # Alternatives measured against tuned-compiled-4096x4 (none was faster on the H200).
    "tuned-compiled-flash-attention-4096x4": {
        "seq_len": 4096,
        "batch_size": 4,
        "compile": True,
        "no_cudnn_attention": True,
    },
    "tuned-compiled-chunk16384-4096x4": {
        "seq_len": 4096,
        "batch_size": 4,
        "compile": True,
        "loss_chunk_tokens": 16384,
    },
    "tuned-compiled-liger-flce-4096x4": {
        "seq_len": 4096,
        "batch_size": 4,
        "compile": True,
        "liger": ("flce",),
    },
    "tuned-compiled-liger-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True, "liger": LIGER_LAYER},
    "tuned-compiled-autotune-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True, "autotune": True},
    "tuned-compiled-8192x4": {"seq_len": 8192, "batch_size": 4, "compile": True},
    "tuned-compiled-4096x14": {"seq_len": 4096, "batch_size": 14, "compile": True},
    "tuned-compiled-4096x16": {"seq_len": 4096, "batch_size": 16, "compile": True},
    "tuned-compiled-cdtune-4096x12": {
        "seq_len": 4096,
        "batch_size": 12,
        "compile": True,
        "coordinate_descent": True,
    },
    "tuned-compiled-cublaslt-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True, "cublaslt": True},
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
    "tuned-compiled-accum8-deferred-isolated-flex-4096x10": {
        "seq_len": 4096,
        "batch_size": 10,
        "compile": True,
        "grad_accum_steps": 8,
        "defer_grad_sync": True,
        "attention": "flex",
        "documents": DOCUMENTS_PER_ROW,
    },
    "tuned-compiled-float8-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True, "float8": True},
    "tuned-compiled-float8-4096x12": {"seq_len": 4096, "batch_size": 12, "compile": True, "float8": True},
}
# Run unless --variants names others. The rest need Liger Kernel installed, take minutes to
# compile (autotuning), or were measured and left out (docs/benchmarks.md, "What did not help").
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
# Keys of a variant that are not TrainConfig fields but switches of the benchmark.
SWITCHES = ("liger", "no_cudnn_attention", "autotune", "coordinate_descent", "cublaslt", "documents")
NAIVE_VARIANTS: dict[str, dict[str, Any]] = {
    "naive-eager-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": False},
    "naive-compiled-4096x4": {"seq_len": 4096, "batch_size": 4, "compile": True},
}

# (overrides of the throughput preset, ranks per node). The preset runs on the 2 x 4
# GPUs of two g6.12xlarge as HSDP (shard 4, replicate 2) or FSDP over all 8.
MEMORY_CASES: dict[str, tuple[dict[str, Any], int]] = {
    f"seq4096x{batch}-{'ac' if ac else 'no-ac'}-{mesh}": (
        {
            "batch_size": batch,
            "activation_checkpointing": ac,
            "hsdp_replicas": 0 if mesh == "hsdp-2x4" else 1,
        },
        4 if mesh == "hsdp-2x4" else 8,
    )
    for batch in (1, 2)
    for ac in (True, False)
    for mesh in ("hsdp-2x4", "fsdp-8")
} | {
    # The preset's shape with 2 micro-batches and --defer-grad-sync: what keeping the whole
    # model's fp32 gradients and gathered layers on every rank costs an L4.
    f"seq4096x2-ac-{mesh}-accum2-deferred": (
        {
            "batch_size": 2,
            "activation_checkpointing": True,
            "hsdp_replicas": 0 if mesh == "hsdp-2x4" else 1,
            "grad_accum_steps": 2,
            "defer_grad_sync": True,
        },
        4 if mesh == "hsdp-2x4" else 8,
    )
    for mesh in ("hsdp-2x4", "fsdp-8")
}
L4_BUDGET_GIB = 20.0


class BenchSession:
    """Rank 0 of a (real or fake) process group: synthetic data, no checkpoints."""

    def __init__(
        self, world_size: int, local_world_size: int, device: torch.device, rows: np.ndarray | None = None
    ) -> None:
        self.rank = 0
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.device = device
        self.rows = rows  # the benchmark's own stored rows (documents_rows), else the config's corpus
        self.summary: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[None]:
        yield None

    @contextlib.contextmanager
    def open_checkpoint(self, location: str) -> Iterator[str]:
        yield location

    def corpus(self, config: TrainConfig) -> Any:
        """The benchmark's rows, or those of a local corpus read in this process, as under torchrun."""
        if self.rows is not None:
            return PackedCorpus(self.rows, "bench-documents")
        return in_process_corpus(config)

    def eval_rows(self, config: TrainConfig) -> Any:
        """The held-out rows, read in this process, as under torchrun."""
        assert config.eval_data is not None
        return in_process_rows(config, config.eval_data, "--eval-data")

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        """Nothing to publish: the loop's own step lines are the log."""

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.summary, self.history = summary, history


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def release_memory() -> None:
    """Compiled graphs hold the previous model alive; drop them between variants."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def benchmark_config(model_config: str, steps: int, **overrides: Any) -> TrainConfig:
    values = {
        **PRESETS["throughput"],
        "preset": "throughput",
        "model_config": model_config,
        "init": "random",
        "steps": steps,
        "storage_path": "unused",
        "tensorboard": False,  # the benchmark's record is its JSON lines, not a run folder
        "run_name": "bench",
        "resume_from": None,
        "local": False,
        "launcher": "torchrun",
    }
    values.update(overrides)
    return TrainConfig(**values)


def start_process_group(backend: str, world_size: int, device: torch.device) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        return
    options: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **options)


def reference_loop(architecture: Any, device: torch.device, steps: int, warmup: int) -> dict[str, Any]:
    """The AWS sample's train.py on one device: bf16 weights, plain AdamW, HF loss, seq 128 x 1."""
    from transformers import AutoModelForCausalLM

    seq_len, batch_size = 128, 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        architecture, dtype=torch.bfloat16, attn_implementation="sdpa"
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_times = []
    for step in range(warmup + steps):
        ids = torch.randint(0, architecture.vocab_size, (batch_size, seq_len), device=device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        if step >= warmup:
            step_times.append(time.perf_counter() - start)
    step_time = statistics.median(step_times)
    tokens_per_s = seq_len * batch_size / step_time
    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    result = {
        "name": "reference-bf16-adamw-128x1",
        "seq_len": seq_len,
        "batch_size": batch_size,
        "steps": steps,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu(tokens_per_s, flops_per_token(architecture, seq_len), peak),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
    }
    del model, optimizer
    return result


def loss_check(architecture: Any, device: torch.device) -> dict[str, Any]:
    """Fused chunked loss (eager and compiled chunk functions) against the full-logits loss
    in float64 on the same bf16 inputs: loss, hidden-state and weight gradients."""
    torch.manual_seed(1)
    tokens, hidden_size = 1024, architecture.hidden_size
    weight = (torch.randn(architecture.vocab_size, hidden_size, device=device) * 0.02).to(torch.bfloat16)
    weight.requires_grad_(True)
    hidden = torch.randn(tokens, hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, architecture.vocab_size, (tokens,), device=device)
    labels[::7] = IGNORE_INDEX

    hidden64, weight64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    reference_loss = F.cross_entropy(hidden64 @ weight64.t(), labels, ignore_index=IGNORE_INDEX)
    reference_grads = torch.autograd.grad(reference_loss, (hidden64, weight64))
    results: dict[str, Any] = {"name": "loss-check", "tokens": tokens, "reference": "float64"}
    for label, chunk_fn in (
        ("eager", chunk_loss_and_logit_grad),
        ("compiled", torch.compile(chunk_loss_and_logit_grad_fusable)),
    ):
        fused_loss = fused_linear_cross_entropy(
            hidden, weight, labels, global_normalizer(labels), 256, chunk_fn
        )
        grads = torch.autograd.grad(fused_loss, (hidden, weight))
        results[f"{label}_loss_rel_err"] = (
            abs(fused_loss.item() - reference_loss.item()) / reference_loss.item()
        )
        for name, grad, reference in zip(("hidden", "weight"), grads, reference_grads, strict=True):
            error = (grad.double() - reference).norm() / reference.norm()
            results[f"{label}_{name}_grad_rel_err"] = error.item()
    return results


@contextlib.contextmanager
def liger_kernels(parts: tuple[str, ...]) -> Iterator[None]:
    """Swap Liger Kernel's Triton modules into Qwen2 (and the loss) for models built inside."""
    if not parts:
        yield
        return
    from liger_kernel.ops import LigerFusedLinearCrossEntropyFunction
    from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP, liger_rotary_pos_emb
    from transformers.models.qwen2 import modeling_qwen2

    import training.model.causal_lm

    def liger_loss(hidden, weight, labels, normalizer, chunk_tokens, chunk_fn):
        loss_sum = LigerFusedLinearCrossEntropyFunction.apply(
            hidden, weight, labels, None, None, IGNORE_INDEX, 0.0, 0.0, "sum"
        )[0]
        return loss_sum / normalizer

    swaps = {
        "rope": (modeling_qwen2, "apply_rotary_pos_emb", liger_rotary_pos_emb),
        "rms_norm": (modeling_qwen2, "Qwen2RMSNorm", LigerRMSNorm),
        "swiglu": (modeling_qwen2, "Qwen2MLP", LigerSwiGLUMLP),
        "flce": (training.model.causal_lm, "fused_linear_cross_entropy", liger_loss),
    }
    saved = [(module, name, getattr(module, name)) for module, name, _ in (swaps[p] for p in parts)]
    for part in parts:
        module, name, replacement = swaps[part]
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def tuned_config(model_config: str, steps: int, spec: dict[str, Any]) -> TrainConfig:
    """One GPU has memory to spare: no recompute, and layers stay gathered for backward."""
    overrides = {key: value for key, value in spec.items() if key not in SWITCHES}
    # Rows of isolated documents come from the session (`documents_rows`), as a corpus of ids.
    corpus = {"data": DOCUMENT_ROWS, "tokenizer": BYTE_TOKENIZER} if spec.get("documents") else {}
    return benchmark_config(
        model_config,
        steps,
        **{
            "reshard_after_forward": False,
            "hsdp_replicas": 1,
            "activation_checkpointing": False,
            "attention": "sdpa",  # the causal loops' cuDNN kernel, as every earlier figure
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
    every earlier figure (and `mfu_causal` half that); `mfu_done` counts the attention FLOPs the
    mask leaves (the pairs inside each document: the masked blocks skipped)."""
    shares = attention_shares(spec)
    seq = spec["seq_len"]
    return {
        "mfu_done": mfu(tokens_per_s, flops_per_token(architecture, seq, attended=shares["attended"]), peak),
        "attended_share": shares["attended"],
        "flex_blocks_share": shares.get("blocks"),
    }


@contextlib.contextmanager
def switches(spec: dict[str, Any]) -> Iterator[None]:
    """The benchmark's switches of a variant: Liger modules, no cuDNN attention, Inductor's
    GEMM autotuning (Triton templates with fused epilogues, as mode="max-autotune-no-cudagraphs"),
    Inductor's coordinate-descent tuning of its Triton kernels' launch parameters, cuBLASLt as
    the BLAS library."""
    import torch._inductor.config as inductor

    cudnn, autotune = torch.backends.cuda.cudnn_sdp_enabled(), inductor.max_autotune
    descent, blas = inductor.coordinate_descent_tuning, torch.backends.cuda.preferred_blas_library()
    if spec.get("no_cudnn_attention"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    inductor.max_autotune = spec.get("autotune", False)
    inductor.coordinate_descent_tuning = spec.get("coordinate_descent", False)
    if spec.get("cublaslt"):
        torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        with liger_kernels(spec.get("liger", ())):
            yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        inductor.max_autotune = autotune
        inductor.coordinate_descent_tuning = descent
        torch.backends.cuda.preferred_blas_library(blas)


def tuned_run(config: TrainConfig, device: torch.device, spec: dict[str, Any]) -> BenchSession:
    """`training.loop.train` on a 1-rank group under the variant's switches; the session holds
    its summary and per-step history."""
    start_process_group("nccl" if device.type == "cuda" else "gloo", 1, device)
    rows = None
    if spec.get("documents"):
        vocab_size = load_architecture(config).vocab_size
        count = config.steps * config.batch_size * config.grad_accum_steps
        rows = documents_rows(count, config.seq_len, spec["documents"], vocab_size, config.seed)
    session = BenchSession(1, 1, device, rows)
    with switches(spec):
        train(config, session)
    assert session.summary is not None
    return session


def tuned_loop(config: TrainConfig, device: torch.device, spec: dict[str, Any]) -> dict[str, Any]:
    summary = tuned_run(config, device, spec).summary
    assert summary is not None
    return summary


def loss_curves(
    model_config: str, device: torch.device, steps: int, runs: dict[str, dict[str, Any]]
) -> tuple[dict[str, list[float]], dict[str, dict[str, Any]]]:
    """Each labelled tuned run in turn, from the same seed: its loss per step and its throughput."""
    curves: dict[str, list[float]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for label, run_spec in runs.items():
        session = tuned_run(tuned_config(model_config, steps, run_spec), device, run_spec)
        assert session.summary is not None
        curves[label] = [row["loss"] for row in session.history]
        summaries[label] = {key: session.summary[key] for key in ("tokens_per_s", "mfu", "peak_mem_gib")}
        release_memory()
    return curves, summaries


def parity_report(
    name: str,
    run: dict[str, Any],
    steps: int,
    curves: dict[str, list[float]],
    summaries: dict[str, dict[str, Any]],
    baseline: str,
    candidate: str,
) -> dict[str, Any]:
    """How far `candidate`'s loss curve lies from `baseline`'s: step by step, and over the last
    fifth of the steps (where noise of single steps averages out)."""
    differences = [other - base for base, other in zip(curves[baseline], curves[candidate], strict=True)]
    tail = max(1, steps // 5)
    last = {label: statistics.mean(curve[-tail:]) for label, curve in curves.items()}
    return {
        "name": name,
        **run,
        "steps": steps,
        "summaries": summaries,
        "loss_first": {label: curve[0] for label, curve in curves.items()},
        "loss_last": {label: curve[-1] for label, curve in curves.items()},
        f"mean_loss_last_{tail}_steps": last,
        "relative_difference_last_steps": (last[candidate] - last[baseline]) / last[baseline],
        "mean_difference": statistics.mean(differences),
        "max_abs_difference": max(abs(difference) for difference in differences),
        "losses": curves,
    }


def float8_parity(
    model_config: str, device: torch.device, data: str, steps: int, spec: dict[str, Any]
) -> dict[str, Any]:
    """The same run (weights, rows, order) in bf16 and with --float8, on a real-text corpus read
    as bytes: both loss curves, and how far apart they are over the last steps."""
    run = {**spec, "data": data, "tokenizer": BYTE_TOKENIZER, "lr": 3e-4, "warmup_steps": 20}
    curves, summaries = loss_curves(
        model_config, device, steps, {"bf16": {**run, "float8": False}, "float8": {**run, "float8": True}}
    )
    return parity_report("float8-parity", run, steps, curves, summaries, "bf16", "float8")


def kernel_parity(
    model_config: str, device: torch.device, data: str, steps: int, spec: dict[str, Any]
) -> dict[str, Any]:
    """The same run (weights, rows, order) of isolated documents with SDPA and with flex, on a
    real-text corpus read as bytes: both loss curves and how far apart they are, step by step."""
    run = {
        **spec,
        "data": data,
        "tokenizer": BYTE_TOKENIZER,
        "document_attention": "isolated",
        "lr": 3e-4,
        "warmup_steps": 10,
    }
    curves, summaries = loss_curves(
        model_config, device, steps, {kernel: {**run, "attention": kernel} for kernel in ("sdpa", "flex")}
    )
    return parity_report("flex-parity", run, steps, curves, summaries, "sdpa", "flex")


def naive_step(
    architecture: Any, device: torch.device, seq_len: int, batch_size: int, compile_layers: bool
) -> Callable[[], torch.Tensor]:
    """What a first FSDP2 loop looks like: fp32 weights with bf16 mixed precision, per-layer
    fully_shard, the Hugging Face loss, default AdamW, clipping; each layer compiled or not."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    start_process_group("nccl" if device.type == "cuda" else "gloo", 1, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            architecture, dtype=torch.float32, attn_implementation="sdpa"
        )
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if compile_layers:
            layer.compile()
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    generator = torch.Generator(device=device).manual_seed(0)

    def step() -> torch.Tensor:
        ids = torch.randint(
            0, architecture.vocab_size, (batch_size, seq_len), device=device, generator=generator
        )
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def tuned_step(model_config: str, device: torch.device, spec: dict[str, Any]) -> Callable[[], torch.Tensor]:
    """One step of the tuned loop (training.loop's own build and step) on fixed micro-batches."""
    config = tuned_config(model_config, 1, spec)
    start_process_group("nccl" if device.type == "cuda" else "gloo", 1, device)
    with switches(spec):
        model, optimizer, architecture, _ = build(config, BenchSession(1, 1, device))
    shape = (config.batch_size, config.seq_len + 1)
    micro_batches = [
        model_batch(
            documents_rows(
                config.batch_size, config.seq_len, spec["documents"], architecture.vocab_size, index
            )
            if spec.get("documents")
            else torch.randint(0, architecture.vocab_size, shape).numpy(),
            device,
        )
        for index in range(config.grad_accum_steps)
    ]

    numbers = itertools.count(1)

    def step() -> torch.Tensor:
        # The loop's step reads its loss itself, before the optimizer step (its one host sync), so
        # here `wall_ms_per_step_loss_read_once` syncs every step too.
        loss, _ = train_step(
            model,
            optimizer,
            micro_batches,
            config.lr,
            config.max_grad_norm,
            config.defer_grad_sync,
            step=next(numbers),
        )
        return torch.tensor(loss)

    return step


PROFILED_LOOPS: dict[str, dict[str, Any]] = {
    "tuned-compiled": {"compile": True},
    "tuned-eager": {"compile": False},
    "tuned-compiled-liger": {"compile": True, "liger": LIGER_LAYER},
    "tuned-compiled-isolated-flex": {"compile": True, "attention": "flex", "documents": DOCUMENTS_PER_ROW},
    "naive-eager": {"naive": True, "compile": False},
    "naive-compiled": {"naive": True, "compile": True},
}


def make_step(
    label: str, seq_len: int, batch_size: int, model_config: str = "qwen2.5-1.5b"
) -> Callable[[], torch.Tensor]:
    """A step closure of one of PROFILED_LOOPS, on GPU 0, for bench.profile_step; it returns
    the loss without reading it, so the caller chooses where the host waits for the GPU."""

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    spec = {**PROFILED_LOOPS[label], "seq_len": seq_len, "batch_size": batch_size}
    if spec.pop("naive", False):
        architecture = load_architecture(benchmark_config(model_config, 1))
        return naive_step(architecture, device, seq_len, batch_size, spec["compile"])
    return tuned_step(model_config, device, spec)


def timed_steps(step: Callable[[], torch.Tensor], steps: int) -> tuple[float, list[float]]:
    """Median step time after one untimed step, and the losses (read every step, as a loop
    that logs each step's loss does)."""
    losses, times = [step().item()], []
    for _ in range(steps - 1):
        start = time.perf_counter()
        losses.append(step().item())
        times.append(time.perf_counter() - start)
    return statistics.median(times), losses


def naive_loop(
    architecture: Any, device: torch.device, steps: int, name: str, spec: dict[str, Any]
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = naive_step(architecture, device, spec["seq_len"], spec["batch_size"], spec["compile"])
    step_time, losses = timed_steps(step, steps)
    tokens_per_s = spec["seq_len"] * spec["batch_size"] / step_time
    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    return {
        "name": name,
        **spec,
        "steps": steps,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu(tokens_per_s, flops_per_token(architecture, spec["seq_len"]), peak),
        **mfu_counts(architecture, spec, tokens_per_s, peak),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


def memory_at_world_size(
    config: TrainConfig, world_size: int, local_world_size: int, device: torch.device
) -> dict[str, Any]:
    start_process_group("fake", world_size, device)
    session = BenchSession(world_size, local_world_size, device)
    train(config, session)
    assert session.summary is not None
    return session.summary


def unless_out_of_memory(run: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any] | None:
    """The run's summary, or None when it ran out of GPU memory.

    Returning rather than handling the error inside the `except` lets the exception and its
    frames, which hold the run's tensors, be freed before the next variant starts.
    """
    try:
        return run(*args)
    except torch.OutOfMemoryError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="JSON file for all results")
    parser.add_argument("--model-config", default="qwen2.5-1.5b", help="architecture (random weights)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--steps", type=int, default=12, help="steps per tuned variant (the first is not timed)"
    )
    parser.add_argument("--reference-steps", type=int, default=30)
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS, choices=list(TUNED_VARIANTS))
    parser.add_argument("--naive", nargs="*", default=list(NAIVE_VARIANTS), choices=list(NAIVE_VARIANTS))
    parser.add_argument("--memory-cases", nargs="*", default=list(MEMORY_CASES), choices=list(MEMORY_CASES))
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument(
        "--float8-parity-steps",
        type=int,
        default=0,
        help="train this many steps in bf16 and with --float8 on --parity-data and compare the losses",
    )
    parser.add_argument(
        "--flex-parity-steps",
        type=int,
        default=0,
        help="train this many steps of isolated documents of --parity-data with SDPA and with flex "
        "and compare the losses",
    )
    parser.add_argument("--parity-data", help="a real-text corpus folder for the parity runs")
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        help="cap this process's GPU memory for the memory cases, as an L4 would (22.5 GiB usable of its 24 GB)",
    )
    args = parser.parse_args()

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    import transformers

    architecture = load_architecture(benchmark_config(args.model_config, 1))
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    report: dict[str, Any] = {
        "gpu_name": gpu_name,
        "peak_bf16_tflops": (peak_flops(gpu_name) or 0) / 1e12 or None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "command": shlex.join(["python", "-m", "bench.train_bench", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model_config": args.model_config,
        "parameters": num_params(architecture),
        "loss_check": None,
        "variants": [],
        "memory_cap_gib": args.memory_cap_gib,
        "memory_at_world_size_8": [],
        "float8_parity": None,
        "flex_parity": None,
    }

    def save() -> None:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)

    report["loss_check"] = loss_check(architecture, device)
    emit(report["loss_check"])
    save()

    if not args.skip_reference:
        result = reference_loop(architecture, device, args.reference_steps, warmup=5)
        report["variants"].append(result)
        emit(result)
        save()
        release_memory()

    for name in args.naive:
        spec = NAIVE_VARIANTS[name]
        measured = unless_out_of_memory(naive_loop, architecture, device, args.steps, name, spec)
        result = measured or {"name": name, **spec, "oom": True}
        report["variants"].append(result)
        emit(result)
        save()
        release_memory()

    for name in args.variants:
        spec = TUNED_VARIANTS[name]
        config = tuned_config(args.model_config, args.steps, spec)
        try:
            summary = unless_out_of_memory(tuned_loop, config, device, spec)
        except Exception as error:  # a variant that breaks is recorded, not fatal to the run
            result = {"name": name, **spec, "error": repr(error)[:500]}
            report["variants"].append(result)
            emit(result)
            release_memory()
            continue
        if summary is None:
            result = {"name": name, **spec, "oom": True}
            report["variants"].append(result)
            emit(result)
            release_memory()
            continue
        result = {
            "name": name,
            **spec,
            "activation_checkpointing": config.activation_checkpointing,
            "steps": config.steps,
            "step_time_s": summary["step_time_s"],
            "tokens_per_s": summary["tokens_per_s"],
            "mfu": summary["mfu"],
            "mfu_causal": summary.get("mfu_causal"),
            **mfu_counts(architecture, spec, summary["tokens_per_s"], peak_flops(gpu_name)),
            "peak_mem_gib": summary["peak_mem_gib"],
            "loss_first": summary["loss_first"],
            "loss_last": summary["loss_last"],
        }
        report["variants"].append(result)
        emit(result)
        save()
        release_memory()

    parity_runs = (
        ("float8_parity", args.float8_parity_steps, float8_parity),
        ("flex_parity", args.flex_parity_steps, kernel_parity),
    )
    for key, parity_steps, parity_run in parity_runs:
        if parity_steps:
            report[key] = parity_run(
                args.model_config,
                device,
                args.parity_data,
                parity_steps,
                {"seq_len": 4096, "batch_size": 4, "compile": True},
            )
            emit({name: value for name, value in report[key].items() if name != "losses"})
            save()

    if args.memory_cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_cap_gib * GIB / total, device)
    for name in args.memory_cases:
        overrides, local_world_size = MEMORY_CASES[name]
        config = benchmark_config(args.model_config, args.memory_steps, **overrides)
        summary = unless_out_of_memory(memory_at_world_size, config, 8, local_world_size, device)
        if summary is None:
            result = {"name": name, "world_size": 8, "oom_under_cap_gib": args.memory_cap_gib}
            report["memory_at_world_size_8"].append(result)
            emit(result)
            save()
            release_memory()
            continue
        result = {
            "name": name,
            "world_size": 8,
            "mesh": "fsdp-8"
            if summary["hsdp_replicas"] == 1
            else f"hsdp-{summary['hsdp_replicas']}x{8 // summary['hsdp_replicas']}",
            **{
                key: dataclasses.asdict(config)[key]
                for key in (
                    "seq_len",
                    "batch_size",
                    "grad_accum_steps",
                    "defer_grad_sync",
                    "compile",
                    "activation_checkpointing",
                )
            },
            "peak_mem_gib": summary["peak_mem_gib"],
            "fits_l4_budget": summary["peak_mem_gib"] <= L4_BUDGET_GIB,
            # Collectives are free under the fake group: this is the rank's compute rate.
            "step_time_s": summary["step_time_s"],
            "tokens_per_s_per_gpu": summary["tokens_per_s_per_gpu"],
        }
        report["memory_at_world_size_8"].append(result)
        emit(result)
        save()
        release_memory()

    if dist.is_initialized():
        dist.destroy_process_group()
    print(
        f"\n{'variant':52} {'tokens/s':>10} {'MFU':>7} {'done':>7} {'step s':>8} {'peak GiB':>9} {'loss':>15}"
    )
    for row in report["variants"]:
        if row.get("oom") or row.get("error"):
            print(f"{row['name']:52} {'out of memory' if row.get('oom') else row['error'][:60]}")
            continue
        mfu_text, done = (
            "-" if row.get(key) is None else f"{100 * row[key]:.1f}%" for key in ("mfu", "mfu_done")
        )
        memory = "-" if row["peak_mem_gib"] is None else f"{row['peak_mem_gib']:.1f}"
        loss = f"{row['loss_first']:.3f}->{row['loss_last']:.3f}" if "loss_first" in row else ""
        print(
            f"{row['name']:52} {row['tokens_per_s']:>10,.0f} {mfu_text:>7} {done:>7} "
            f"{row['step_time_s']:>8.3f} {memory:>9} {loss:>15}"
        )
    flex = report["flex_parity"]
    if flex:
        print(
            f"flex parity over {flex['steps']} steps: last loss sdpa {flex['loss_last']['sdpa']:.4f}, "
            f"flex {flex['loss_last']['flex']:.4f}; max |difference| {flex['max_abs_difference']:.4f}, "
            f"mean {flex['mean_difference']:+.4f}"
        )
    parity = report["float8_parity"]
    if parity:
        tail = next(key for key in parity if key.startswith("mean_loss_last_"))
        print(
            f"float8 parity over {parity['steps']} steps: {tail.replace('_', ' ')} "
            f"bf16 {parity[tail]['bf16']:.4f}, float8 {parity[tail]['float8']:.4f} "
            f"({100 * parity['relative_difference_last_steps']:+.2f}%)"
        )
    for row in report["memory_at_world_size_8"]:
        if "oom_under_cap_gib" in row:
            print(f"{row['name']:32} out of memory under a {row['oom_under_cap_gib']} GiB cap")
            continue
        print(
            f"{row['name']:32} per-rank peak at world size 8: {row['peak_mem_gib']:.1f} GiB,"
            f" {row['tokens_per_s_per_gpu']:,.0f} tok/s per rank"
        )


if __name__ == "__main__":
    main()
