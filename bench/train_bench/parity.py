"""Checks of the loss: the fused chunked loss against float64, and two runs of the same rows from one
seed (bf16 against float8, SDPA against flex) compared step by step."""

from __future__ import annotations

import statistics
from typing import Any

import torch
import torch.nn.functional as F

from bench.train_bench.loops import tuned_run
from bench.train_bench.session import release_memory
from bench.train_bench.variants import tuned_config
from training.config.run_config import BYTE_TOKENIZER
from training.model.loss import (
    IGNORE_INDEX,
    chunk_loss_and_logit_grad,
    chunk_loss_and_logit_grad_fusable,
    fused_linear_cross_entropy,
    global_normalizer,
)


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
    other_seed: str | None = None,
) -> dict[str, Any]:
    """How far `candidate`'s loss curve lies from `baseline`'s: step by step, and over the last
    fifth of the steps (where noise of single steps averages out); with `other_seed`, the label of
    the baseline run from another seed, how far that lies from the baseline over the same steps
    (`seed_spread_last_steps`)."""
    differences = [other - base for base, other in zip(curves[baseline], curves[candidate], strict=True)]
    tail = max(1, steps // 5)
    last = {label: statistics.mean(curve[-tail:]) for label, curve in curves.items()}
    spread = (
        {}
        if other_seed is None
        else {"seed_spread_last_steps": (last[other_seed] - last[baseline]) / last[baseline]}
    )
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
        **spread,
    }


# The second bf16 run's seed in `float8_parity` (the others train from the config's default, 0).
OTHER_SEED = 1


def float8_parity(
    model_config: str, device: torch.device, data: str, steps: int, spec: dict[str, Any]
) -> dict[str, Any]:
    """The same run (weights, rows, order) in bf16 and with --float8, on a real-text corpus read
    as bytes: both loss curves, and how far apart they are over the last steps; beside them bf16
    from another seed (other weights, another order), whose distance from the first is the spread
    a float8 difference must stay inside (`seed_spread_last_steps`)."""
    run = {**spec, "data": data, "tokenizer": BYTE_TOKENIZER, "lr": 3e-4, "warmup_steps": 20}
    other_seed = f"bf16-seed-{OTHER_SEED}"
    curves, summaries = loss_curves(
        model_config,
        device,
        steps,
        {
            "bf16": {**run, "float8": False},
            other_seed: {**run, "float8": False, "seed": OTHER_SEED},
            "float8": {**run, "float8": True},
        },
    )
    return parity_report("float8-parity", run, steps, curves, summaries, "bf16", "float8", other_seed)


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
