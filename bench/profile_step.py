"""Where a training step's GPU time goes: torch.profiler over a few steps of a loop.

Prints the kernels that take the most GPU time, grouped into families (matmul,
attention, optimizer, ...), and for the largest kernels the Python frames that
launched them, so a stray kernel can be traced to its line. Writes the tables
and a Chrome trace under --out.

    python -m bench.profile_step --out /tmp/profile --seq-len 4096 --batch-size 4
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.train_bench import PROFILED_LOOPS, make_step, release_memory

# Kernel families, first match wins; the names are those of cuBLAS/CUTLASS, cuDNN,
# Inductor's Triton kernels and ATen's CUDA kernels as the profiler shows them.
FAMILIES = (
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel")),
    ("compiled (triton)", ("triton_",)),
    ("copy", ("copy", "memcpy", "cat", "chunk_cat", "split_with_sizes")),
    ("fill", ("fill", "memset")),
)


def family(kernel: str) -> str:
    name = kernel.lower()
    for label, needles in FAMILIES:
        if any(needle in name for needle in needles):
            return label
    return "other"


def kernel_table(prof: Any, steps: int) -> dict[str, Any]:
    """Per-step GPU time by kernel and family, and the launching frames of the largest kernels."""
    by_kernel: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    origins: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for event in prof.events():
        for kernel in getattr(event, "kernels", []):
            by_kernel[kernel.name] += kernel.duration
            calls[kernel.name] += 1
            frames = [
                frame
                for frame in (event.stack or [])
                if ("training" in frame or "transformers" in frame or "bench" in frame)
            ]
            origins[kernel.name][f"{event.name} <- {' <- '.join(frames[:4])}"] += kernel.duration
    families: collections.Counter[str] = collections.Counter()
    for name, micros in by_kernel.items():
        families[family(name)] += micros
    top = by_kernel.most_common(25)
    return {
        "gpu_ms_per_step": sum(by_kernel.values()) / 1e3 / steps,
        "families_ms_per_step": {k: v / 1e3 / steps for k, v in families.most_common()},
        "top_kernels": [
            {
                "kernel": name[:160],
                "family": family(name),
                "ms_per_step": micros / 1e3 / steps,
                "calls_per_step": calls[name] / steps,
                "launched_from": [
                    {"origin": origin[:400], "ms_per_step": us / 1e3 / steps}
                    for origin, us in origins[name].most_common(3)
                ],
            }
            for name, micros in top
        ],
    }


def profile_steps(
    step: Callable[[], object], warmup: int, steps: int, out: str, label: str
) -> dict[str, Any]:
    """Run `step` warmup times, then `steps` times under the profiler; the wall time per step too."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
    result = {
        "label": label,
        "wall_ms_per_step": start.elapsed_time(end) / steps,
        **kernel_table(prof, steps),
    }
    prof.export_chrome_trace(os.path.join(out, f"{label}.trace.json"))
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n== {result['label']}: {result['wall_ms_per_step']:.1f} ms/step wall, "
        f"{result['gpu_ms_per_step']:.1f} ms/step of kernels"
    )
    for name, ms in result["families_ms_per_step"].items():
        print(f"  {name:20} {ms:8.1f} ms")
    for row in result["top_kernels"][:15]:
        print(f"  {row['ms_per_step']:7.2f} ms x{row['calls_per_step']:<6.0f} {row['kernel'][:90]}")
        for origin in row["launched_from"][:1]:
            print(f"        from {origin['origin'][:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--loops",
        nargs="*",
        default=["tuned-compiled", "tuned-eager", "naive-eager"],
        choices=list(PROFILED_LOOPS),
    )
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    results = []
    for label in args.loops:
        step = make_step(label, args.seq_len, args.batch_size)
        results.append(profile_steps(step, args.warmup, args.steps, args.out, label))
        print_table(results[-1])
        del step
        release_memory()
        with open(os.path.join(args.out, "profile.json"), "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
