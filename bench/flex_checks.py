"""FlexAttention on a GPU: is it exact, and would it compile on a GPU with little shared memory?

- Isolation: a packed row of three documents of unaligned lengths (not multiples of the 128-token
  block), run through the job's model with the job's block mask (`training.model.attention`), against
  document 2 run alone: its logits (max |difference|, relative norm), and the job's fused loss over
  its labels in the row and alone. The same row with plain causal attention shows the check can
  fail. The tiny model in float32 and the Qwen2.5-1.5B architecture in bf16, random weights.
- Grouped heads: flex with each query head reading its key-value head in place
  (bench/train_bench/grouped_flex.py) against the key-value heads copied to the query heads'
  count first (the job's flex path), both against float64 attention: output and gradients, at
  the 1.5B head shape in bf16.
- Small shared memory: the start-up compile check (`training.model.attention.flex_compile_error`) of the
  Qwen2.5-1.5B head shape with each tile choice the job tries, with Inductor picking tiles as for
  an L4 (sm_89) and any kernel above the L4's 99 KiB of shared memory a block refused at load, the
  tiles torch picks there and the shared memory each flex kernel needs. The kernels are compiled
  for this GPU (sm_90), whose needs can differ from sm_89's, so this approximates an L4.
- Fallback: the job's loop with `--attention auto` on isolated documents where
  the compile check cannot fit any tiles (a shared-memory limit of 8 KiB for the check alone): one
  warning line, then training with SDPA.

    python -m bench.flex_checks --out bench/reports/flex-attention_HW_YYYYMM/flex-checks.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import platform
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from training.config.run_config import parse_flags
from training.data.packing import DOCUMENT_START
from training.model.attention import TILE_CHOICES, document_block_mask, flex_compile_error
from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture, model_batch
from training.model.loss import IGNORE_INDEX

# The L4's shared memory a block (sm_89: 99 KiB, CUDA's compute-capability table) and capability.
L4_SHARED_MEMORY_BYTES = 99 * 1024
L4_CAPABILITY = (8, 9)
DOCUMENT_LENGTHS = (300, 200, 250)
# The checks, in the order they run (--checks).
CHECKS = ("isolation", "grouped-heads", "small-shared-memory", "fallback")


def isolation(model_config: str, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """Document 2 of a packed row against document 2 alone, through the job's flex path."""
    config = parse_flags(["--preset", "tiny", "--gpu", "--attention", "flex", "--model-config", model_config])
    architecture = load_architecture(config)
    causal_lm = build_causal_lm(config, architecture, device).to(dtype).eval()
    generator = np.random.default_rng(2)
    total = sum(DOCUMENT_LENGTHS)
    stored = generator.integers(0, architecture.vocab_size, size=(1, total + 1), dtype=np.int32)
    starts = np.cumsum((0, *DOCUMENT_LENGTHS))[:-1]
    stored[0, starts] |= DOCUMENT_START
    batch = model_batch(stored, device)
    assert batch.document_ids is not None and batch.position_ids is not None
    second = slice(int(starts[1]), int(starts[2]))
    alone_ids = batch.input_ids[:, second]
    with torch.no_grad():
        alone = causal_lm(input_ids=alone_ids, use_cache=False).logits[0].float()
        mask = document_block_mask(batch.document_ids)
        isolated = (
            causal_lm(
                input_ids=batch.input_ids,
                position_ids=batch.position_ids,
                attention_mask=mask,
                use_cache=False,
            )
            .logits[0, second]
            .float()
        )
        causal = causal_lm(input_ids=batch.input_ids, use_cache=False).logits[0, second].float()
        model = CausalLMWithFusedLoss(causal_lm, loss_chunk_tokens=256)
        only_second = torch.full_like(batch.labels, IGNORE_INDEX)
        labels = slice(second.start, second.stop - 1)
        only_second[0, labels] = batch.labels[0, labels]
        in_the_row = model(batch.input_ids, only_second, None, batch.position_ids, batch.document_ids)
        by_itself = model(alone_ids[:, :-1], alone_ids[:, 1:])

    def compared(logits: torch.Tensor) -> dict[str, float]:
        return {
            "max_abs_difference": (logits - alone).abs().max().item(),
            "relative_norm_difference": ((logits - alone).norm() / alone.norm()).item(),
        }

    return {
        "model_config": model_config,
        "dtype": str(dtype).removeprefix("torch."),
        "document_lengths": list(DOCUMENT_LENGTHS),
        "isolated_flex_vs_alone": compared(isolated),
        "causal_packed_vs_alone": compared(causal),
        "loss_in_the_row": in_the_row.item(),
        "loss_alone": by_itself.item(),
    }


def grouped_heads(device: torch.device, lengths: tuple[int, ...] = (300, 200, 250, 274)) -> dict[str, Any]:
    """Flex on grouped heads (`grouped_flex_attention`: each query head reads its key-value head in
    place) against the job's (the key-value heads copied to the query heads' count first), at
    the 1.5B head shape under the job's mask of documents of unaligned `lengths`, in bf16, compiled:
    the output and the gradients of the query, keys and values of each, as relative norm
    differences from float64 attention over the dense mask (SDPA on repeated heads)."""
    from transformers.integrations.flex_attention import repeat_kv

    from bench.train_bench.grouped_flex import grouped_flex_attention

    architecture = load_architecture(
        dataclasses.replace(parse_flags(["--preset", "throughput"]), init="random")
    )
    heads, kv_heads = architecture.num_attention_heads, architecture.num_key_value_heads
    head_dim, group = architecture.hidden_size // heads, heads // kv_heads
    seq = sum(lengths)
    document_ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    ).int()
    document_ids = torch.stack([document_ids, document_ids.flip(0).max() - document_ids.flip(0)])
    generator = torch.Generator(device=device).manual_seed(3)
    shapes = {
        "q": (2, heads, seq, head_dim),
        "k": (2, kv_heads, seq, head_dim),
        "v": (2, kv_heads, seq, head_dim),
    }
    inputs = {name: torch.randn(shape, device=device, generator=generator) for name, shape in shapes.items()}
    upstream = torch.randn((2, seq, heads, head_dim), device=device, generator=generator)
    mask = document_block_mask(document_ids)
    module = torch.nn.Module()

    def run(repeated: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        q, k, v = (inputs[name].to(dtype).requires_grad_() for name in ("q", "k", "v"))
        if dtype == torch.float64:
            causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
            allowed = (document_ids[:, :, None] == document_ids[:, None, :]) & causal
            out = torch.nn.functional.scaled_dot_product_attention(
                q, repeat_kv(k, group), repeat_kv(v, group), attn_mask=allowed[:, None]
            ).transpose(1, 2)
        elif repeated:
            out, _ = grouped_flex_attention(module, q, repeat_kv(k, group), repeat_kv(v, group), mask)
        else:
            out, _ = grouped_flex_attention(module, q, k, v, mask)
        (out.float() * upstream).sum().backward()
        return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}  # type: ignore[dict-item]

    reference = run(False, torch.float64)
    result: dict[str, Any] = {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "document_lengths": list(lengths),
    }
    for label, repeated in (("grouped", False), ("repeated", True)):
        got = run(repeated, torch.bfloat16)
        result[label] = {
            name: ((got[name].double() - reference[name]).norm() / reference[name].norm()).item()
            for name in reference
        }
    return result


@contextlib.contextmanager
def shared_memory_limit(max_shared_bytes: int, capability: tuple[int, int]) -> Iterator[list[list[Any]]]:
    """Inductor picks tiles as for `capability`, and a kernel that needs more than
    `max_shared_bytes` of shared memory a block is refused when it is loaded (Triton's
    OutOfResources), as on a GPU of that limit; the kernels are still compiled for this GPU. Yields
    the [name, shared bytes] of every kernel loaded meanwhile."""
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    from torch._inductor.runtime.triton_compat import OutOfResources
    from triton.runtime import driver

    # Inductor caches each device's properties, its compile target among them, on first use: fix
    # them to this GPU's now, so that kernels compiled under the patch still run here.
    DeviceProperties.create(torch.device("cuda", torch.cuda.current_device()))
    loaded: list[list[Any]] = []
    utils = driver.active.utils
    real_properties, real_capability = utils.get_device_properties, torch.cuda.get_device_capability
    real_load = StaticallyLaunchedCudaKernel.load_kernel

    def properties(device: Any) -> dict[str, Any]:  # Triton's own launcher reads the limit here
        return {**real_properties(device), "max_shared_mem": max_shared_bytes}

    def load_kernel(kernel: Any, device: int) -> None:  # Inductor's static launcher: check it here
        loaded.append([kernel.name, kernel.shared])
        if kernel.shared > max_shared_bytes:
            raise OutOfResources(kernel.shared, max_shared_bytes, "shared memory")
        real_load(kernel, device)

    utils.get_device_properties = properties
    torch.cuda.get_device_capability = lambda device=None: capability
    StaticallyLaunchedCudaKernel.load_kernel = load_kernel  # type: ignore[method-assign,assignment]
    torch._dynamo.reset()
    try:
        yield loaded
    finally:
        utils.get_device_properties = real_properties
        torch.cuda.get_device_capability = real_capability
        StaticallyLaunchedCudaKernel.load_kernel = real_load  # type: ignore[method-assign]
        torch._dynamo.reset()


def torch_tiles(head_dim: int) -> dict[str, Any]:
    """The forward and backward tiles torch's Inductor picks for bf16 at `head_dim` on this GPU."""
    from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic

    heuristic = CUDAConfigHeuristic()
    return {
        "forward": [str(c) for c in heuristic.get_flex_attn_fwd_configs(head_dim, torch.bfloat16)],
        "backward": [str(c) for c in heuristic.get_flex_attn_bwd_configs(head_dim, torch.bfloat16)],
    }


def small_shared_memory(device: torch.device) -> dict[str, Any]:
    """The start-up compile check of the 1.5B head shape, here and under the L4's limits."""
    architecture = load_architecture(
        dataclasses.replace(parse_flags(["--preset", "throughput"]), init="random")
    )
    head_dim = architecture.hidden_size // architecture.num_attention_heads
    result: dict[str, Any] = {
        "head_dim": head_dim,
        "this_gpu": {
            "capability": list(torch.cuda.get_device_capability(device)),
            # Not in CPU builds' type stubs; read on the device.
            "shared_memory_per_block_optin": getattr(
                torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None
            ),
            "torch_tiles": torch_tiles(head_dim),
            "compile_errors": [flex_compile_error(architecture, device, tiles) for tiles in TILE_CHOICES],
        },
    }
    for label, limit, capability in (
        ("as_l4", L4_SHARED_MEMORY_BYTES, L4_CAPABILITY),
        ("this_gpu_tiles_loaded", 1 << 30, torch.cuda.get_device_capability(device)),
    ):
        with shared_memory_limit(limit, capability) as loaded:
            result[label] = {
                "capability": list(capability),
                "max_shared_bytes": limit,
                "torch_tiles": torch_tiles(head_dim),
                "compile_errors": [flex_compile_error(architecture, device, tiles) for tiles in TILE_CHOICES],
                "flex_kernels_shared_bytes": [entry for entry in loaded if "flex" in entry[0]],
            }
    result["tile_choices"] = [tiles or "torch's own" for tiles in TILE_CHOICES]
    return result


def fallback_run(device: torch.device, max_shared_bytes: int = 8 * 1024) -> dict[str, Any]:
    """The job's loop with `--attention auto` on isolated documents where flex cannot compile: the
    start-up compile check runs under a shared-memory limit no tile choice fits (the training after
    it does not), so the run should say so in one line and train with SDPA."""
    import io

    import training.model.attention
    from bench.train_bench.loops import tuned_run
    from bench.train_bench.variants import tuned_config

    real_check = training.model.attention.flex_compile_error

    def limited_check(architecture: Any, device: torch.device, tiles: dict[str, Any] | None) -> str | None:
        with shared_memory_limit(max_shared_bytes, L4_CAPABILITY):
            return real_check(architecture, device, tiles)

    spec = {"seq_len": 1024, "batch_size": 4, "compile": True, "attention": "auto", "documents": 4}
    config = tuned_config("qwen2.5-1.5b", 4, spec)
    output = io.StringIO()
    training.model.attention.flex_compile_error = limited_check
    try:
        with contextlib.redirect_stdout(output):
            session = tuned_run(config, device, spec)
    finally:
        training.model.attention.flex_compile_error = real_check
    assert session.summary is not None
    lines = output.getvalue().splitlines()
    return {
        "max_shared_bytes_for_the_check": max_shared_bytes,
        "spec": spec,
        "warning_lines": [line for line in lines if line.startswith("warning:")],
        "step_lines": [line for line in lines if line.startswith("step ")],
        "loss_first": session.summary["loss_first"],
        "loss_last": session.summary["loss_last"],
        "tokens_per_s": session.summary["tokens_per_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="the checks to run (default: all)"
    )
    args = parser.parse_args()
    import transformers

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    report: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.flex_checks", *sys.argv[1:]]),
        "gpu_name": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "isolation": [],
        "grouped_heads": None,
        "small_shared_memory": None,
    }

    def save() -> None:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)

    if "isolation" in args.checks:
        for model_config, dtype in (("tiny", torch.float32), ("qwen2.5-1.5b", torch.bfloat16)):
            report["isolation"].append(isolation(model_config, dtype, device))
            print(json.dumps(report["isolation"][-1]), flush=True)
            save()
    if "grouped-heads" in args.checks:
        report["grouped_heads"] = grouped_heads(device)
        print(json.dumps(report["grouped_heads"]), flush=True)
        save()
    if "small-shared-memory" in args.checks:
        try:
            report["small_shared_memory"] = small_shared_memory(device)
        except Exception as error:  # the check leans on torch and Triton internals; record, do not stop
            report["small_shared_memory"] = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
        print(json.dumps(report["small_shared_memory"], indent=1), flush=True)
        save()
    if "fallback" in args.checks:
        report["fallback"] = fallback_run(device)
        print(json.dumps(report["fallback"], indent=1), flush=True)
        save()


if __name__ == "__main__":
    main()
