"""The loops measured: AWS's sample loop, a naive FSDP2 loop, and the tuned loop (`training.loop`
itself), each timed over its steps; and the step closures `bench.profile_step` profiles."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.train_bench.dtensor_adamw import with_dtensor_adamw
from bench.train_bench.grouped_flex import grouped_flex
from bench.train_bench.session import BenchSession, benchmark_config, start_process_group, timed_steps
from bench.train_bench.variants import DOCUMENTS_PER_ROW, documents_rows, mfu_counts, tuned_config
from training.build import build
from training.config.run_config import TrainConfig
from training.loop import train
from training.metrics.flops import flops_per_token, mfu, peak_flops
from training.metrics.run_metrics import GIB
from training.model.causal_lm import load_architecture, model_batch
from training.step import train_step


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


def variant_code(spec: dict[str, Any]) -> contextlib.ExitStack:
    """The code a variant swaps in for its run: flex on grouped heads, torch's AdamW on DTensors."""
    stack = contextlib.ExitStack()
    if spec.get("grouped_kv"):
        stack.enter_context(grouped_flex())
    if spec.get("dtensor_adamw"):
        stack.enter_context(with_dtensor_adamw())
    return stack


def tuned_run(config: TrainConfig, device: torch.device, spec: dict[str, Any]) -> BenchSession:
    """`training.loop.train` on a 1-rank group; the session holds its summary and per-step history."""
    start_process_group("nccl" if device.type == "cuda" else "gloo", 1, device)
    rows = None
    if spec.get("documents"):
        vocab_size = load_architecture(config).vocab_size
        count = config.steps * config.batch_size * config.grad_accum_steps
        rows = documents_rows(count, config.seq_len, spec["documents"], vocab_size, config.seed)
    session = BenchSession(1, 1, device, rows)
    with variant_code(spec):
        train(config, session)
    assert session.summary is not None
    return session


def tuned_loop(config: TrainConfig, device: torch.device, spec: dict[str, Any]) -> dict[str, Any]:
    summary = tuned_run(config, device, spec).summary
    assert summary is not None
    return summary


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
    with variant_code(spec):
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
    "tuned-compiled-isolated-flex": {"compile": True, "attention": "flex", "documents": DOCUMENTS_PER_ROW},
    "tuned-compiled-isolated-flex-dtensor-adamw": {
        "compile": True,
        "attention": "flex",
        "documents": DOCUMENTS_PER_ROW,
        "dtensor_adamw": True,
    },
    "tuned-compiled-accum4-isolated-flex": {
        "compile": True,
        "attention": "flex",
        "documents": DOCUMENTS_PER_ROW,
        "grad_accum_steps": 4,
    },
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
