"""The training loop, the same under Ray Train and torchrun.

It talks to its launcher only through a `Session` (rank, device, checkpoints,
corpus shard, reporting), so it never needs to know which launcher it runs in.
"""

from __future__ import annotations

import itertools
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, ContextManager, Protocol

import numpy as np
import torch
import torch.distributed as dist

from training.checkpoint import export_hugging_face, load_checkpoint, save_checkpoint
from training.config import BYTE_TOKENIZER, TrainConfig
from training.data import synthetic_batches
from training.flops import flops_per_token, mfu, num_params, peak_flops
from training.model import (
    CausalLMWithFusedLoss,
    build_causal_lm,
    build_mesh,
    build_optimizer,
    learning_rate,
    load_architecture,
    parallelize,
    replica_groups,
)
from training.report import format_progress_line, format_step_line
from training.tokenizer import load_tokenizer

GIB = 2**30


class Session(Protocol):
    """What a launcher provides to the loop."""

    rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    def latest_checkpoint(self) -> ContextManager[str | None]:
        """A folder holding the newest complete checkpoint, or None."""

    def corpus_batches(self, config: TrainConfig) -> Iterator[np.ndarray]:
        """This rank's endless stream of [batch, seq_len + 1] packed rows of the corpus."""

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        """Publish a step's metrics; `save(folder)` writes a checkpoint when one is due."""

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Publish the run summary and per-step history."""


def emit(line: str) -> None:
    """Write a console line. Not print(): Ray Train replaces print in workers with a
    logger that echoes every line to stderr too, which would double each step line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory, or the process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _max_across_ranks(value: float, device: torch.device) -> float:
    tensor = torch.tensor([value], dtype=torch.float32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def _mean_across_ranks(loss: torch.Tensor, world_size: int) -> float:
    """The global batch's loss; the .item() is the step's one host synchronisation."""
    total = loss.detach().float().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return total.item() / world_size


def _batches(config: TrainConfig, session: Session, vocab_size: int, start_step: int) -> Iterator[np.ndarray]:
    if config.synthetic_data:
        return synthetic_batches(
            seed=config.seed,
            rank=session.rank,
            start_step=start_step,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            vocab_size=vocab_size,
        )
    # Replaying the consumed rows keeps a resumed run on the exact data it would have seen.
    return itertools.islice(session.corpus_batches(config), start_step, None)


def _check_fits(config: TrainConfig, architecture: Any) -> None:
    limit = getattr(architecture, "max_position_embeddings", None)
    if limit is not None and config.seq_len > limit:
        raise ValueError(f"seq_len {config.seq_len} exceeds the model's max_position_embeddings {limit}")
    if not config.synthetic_data:
        tokens = load_tokenizer(config.tokenizer).vocab_size
        if tokens > architecture.vocab_size:
            raise ValueError(f"tokenizer has {tokens} tokens, the model only {architecture.vocab_size}")


def build(
    config: TrainConfig, session: Session
) -> tuple[CausalLMWithFusedLoss, torch.optim.Optimizer, Any, int]:
    """The sharded model, its optimizer, the architecture and the HSDP replica count."""
    architecture = load_architecture(config)
    _check_fits(config, architecture)
    replicas = replica_groups(session.world_size, session.local_world_size, config.hsdp_replicas)
    mesh = build_mesh(session.device.type, session.world_size, replicas)
    model = CausalLMWithFusedLoss(
        build_causal_lm(config, architecture, session.device), config.loss_chunk_tokens
    )
    parallelize(
        model,
        mesh,
        compile_layers=config.compile,
        activation_checkpointing=config.activation_checkpointing,
        reshard_after_forward=config.reshard_after_forward,
    )
    model.train()
    return model, build_optimizer(model, config, session.device), architecture, replicas


def train_step(
    model: CausalLMWithFusedLoss,
    optimizer: torch.optim.Optimizer,
    rows: torch.Tensor,
    lr: float,
    max_grad_norm: float,
) -> torch.Tensor:
    """One optimizer step on [batch, seq_len + 1] token rows; returns the (unsynchronised) loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model(rows[:, :-1], rows[:, 1:])
    loss.backward()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(config: TrainConfig, session: Session) -> dict[str, Any]:
    """Build, resume if a checkpoint exists, train up to config.steps, hand the summary to the session."""
    started = time.perf_counter()
    device = session.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model, optimizer, architecture, replicas = build(config, session)

    start_step, history = 0, []
    with session.latest_checkpoint() as checkpoint_path:
        if checkpoint_path is not None:
            state = load_checkpoint(checkpoint_path, model, optimizer)
            start_step, history = state["step"], state["history"]
            if session.rank == 0:
                emit(f"resumed from step {start_step} ({checkpoint_path})")

    def save(step: int) -> Callable[[str], None]:
        def write(path: str) -> None:
            save_checkpoint(path, model, optimizer, {"step": step, "history": history}, session.rank)
            if config.export_hf and step == config.steps:
                tokenizer = None if config.tokenizer == BYTE_TOKENIZER else load_tokenizer(config.tokenizer)
                export_hugging_face(path, model, model.causal_lm, "causal_lm.", tokenizer, session.rank)

        return write

    batches = _batches(config, session, architecture.vocab_size, start_step)
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    flops_token = flops_per_token(architecture, config.seq_len)
    peak = peak_flops(gpu_name)
    tokens_per_step = config.batch_size * config.seq_len * session.world_size
    step_times: list[float] = []
    losses: list[float] = []
    for step in range(start_step + 1, config.steps + 1):
        step_start = time.perf_counter()
        # A copy: Ray Data hands out read-only arrays, which torch cannot wrap.
        rows = torch.tensor(next(batches), device=device)
        loss = train_step(model, optimizer, rows, learning_rate(config, step), config.max_grad_norm)
        loss_value = _mean_across_ranks(loss, session.world_size)
        step_time = time.perf_counter() - step_start

        step_times.append(step_time)
        losses.append(loss_value)
        tokens_per_s = tokens_per_step / step_time
        metrics = {
            "step": step,
            "steps": config.steps,
            "loss": loss_value,
            "step_time_s": step_time,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": tokens_per_s / session.world_size,
            "mfu": mfu(tokens_per_s / session.world_size, flops_token, peak),
            "peak_mem_gib": peak_memory_gib(device),
        }
        history.append(
            {"step": step, "loss": loss_value, "tokens_per_s": tokens_per_s, "step_time_s": step_time}
        )
        if session.rank == 0:
            emit(format_progress_line(metrics))
            emit(format_step_line(metrics))
        due = config.checkpoint_every and (step % config.checkpoint_every == 0 or step == config.steps)
        due = due or (config.export_hf and step == config.steps)
        session.report(metrics, step, save(step) if due else None)

    # Step one pays for compilation and allocator warm-up; it would skew the rate.
    measured = step_times[1:] or step_times
    step_time = statistics.median(measured) if measured else None
    tokens_per_s = tokens_per_step / step_time if step_time else None
    per_gpu = tokens_per_s / session.world_size if tokens_per_s else None
    summary = {
        "world_size": session.world_size,
        "steps": config.steps,
        "start_step": start_step,
        "steps_run": len(step_times),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": per_gpu,
        "steps_per_s": 1 / step_time if step_time else None,
        "mfu": mfu(per_gpu, flops_token, peak) if per_gpu else None,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "peak_mem_gib": _max_across_ranks(peak_memory_gib(device), device),
        "step_time_s": step_time,
        "duration_s": time.perf_counter() - started,
        "gpu_name": gpu_name,
        "device": device.type,
        "model": config.model_id,
        "init": config.init,
        "parameters": num_params(architecture),
        "flops_per_token": flops_token,
        "preset": config.preset,
        "data": "synthetic" if config.synthetic_data else "corpus",
        "seq_len": config.seq_len,
        "batch_size": config.batch_size,
        "tokens_per_step": tokens_per_step,
        "hsdp_replicas": replicas,
        "compile": config.compile,
        "activation_checkpointing": config.activation_checkpointing,
        "run_name": config.run_name,
        "run_dir": None,
        "summary_path": None,
    }
    session.finish(summary, history)
    return summary
