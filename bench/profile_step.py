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
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.train_bench.loops import PROFILED_LOOPS, make_step
from bench.train_bench.session import release_memory

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


# Python frames worth naming as a kernel's origin: this project, the model, FSDP's hooks and
# collectives, and the Inductor-generated modules of compiled layers (innermost first).
ORIGIN_FRAMES = ("training/", "transformers/", "bench/", "torch/distributed/", "torchinductor", "_functorch/")


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
            frames = [frame for frame in (event.stack or []) if any(part in frame for part in ORIGIN_FRAMES)]
            # Shapes tell which tensor a copy or cast moves (FSDP's buffers, an activation).
            shapes = f" {event.input_shapes}" if family(kernel.name) == "copy" else ""
            origin = f"{event.name}{shapes} <- {' <- '.join(frames[:4])}"
            origins[kernel.name][origin] += kernel.duration
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
                    for origin, us in origins[name].most_common(5)
                ],
            }
            for name, micros in top
        ],
    }


def idle_gaps(trace_path: str, steps: int, top: int = 12) -> dict[str, Any]:
    """The GPU's idle time from a Chrome trace: the gaps between busy intervals (kernels,
    copies, fills on any stream), and for the largest gaps the kernels on either side and
    the Python frames the host was in at the gap's middle (what kept it from launching)."""
    with open(trace_path) as handle:
        events = json.load(handle)["traceEvents"]
    device = sorted(
        (event["ts"], event["ts"] + event["dur"], event["name"])
        for event in events
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    frames = [
        (event["ts"], event["ts"] + event["dur"], event["name"])
        for event in events
        if event.get("ph") == "X" and event.get("cat") == "python_function"
    ]
    gaps = []
    busy_until, last_name = device[0][1], device[0][2]
    for start, end, name in device[1:]:
        if start > busy_until:
            gaps.append((start - busy_until, busy_until, last_name, name))
        if end > busy_until:
            busy_until, last_name = end, name
    idle_us = sum(gap[0] for gap in gaps)

    def host_frames(moment: float) -> list[str]:
        around = [f for f in frames if f[0] <= moment <= f[1]]
        # Innermost last; keep the frames of this project, torch's optimizer, clipping and FSDP.
        wanted = ("training/", "bench/", "torch/optim", "torch/nn/utils", "torch/distributed", "_dynamo")
        names = [f[2] for f in sorted(around, key=lambda f: f[1] - f[0], reverse=True)]
        return [name[:120] for name in names if any(w in name for w in wanted)][-4:]

    largest = sorted(gaps, reverse=True)[:top]
    return {
        "gpu_idle_ms_per_step": idle_us / 1e3 / steps,
        "gaps_over_100us_per_step": sum(1 for gap in gaps if gap[0] > 100) / steps,
        "largest_gaps": [
            {
                "ms": duration / 1e3,
                "after_kernel": before[:100],
                "before_kernel": after[:100],
                "host_in": host_frames(at + duration / 2),
            }
            for duration, at, before, after in largest
        ],
    }


def wall_ms_per_step(step: Callable[[], torch.Tensor], steps: int, read_each_loss: bool) -> float:
    """Wall time per step, reading each step's loss (as the loop does) or only the last."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
        if read_each_loss:
            loss.item()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / steps


def profile_steps(
    step: Callable[[], torch.Tensor], warmup: int, steps: int, out: str, label: str
) -> dict[str, Any]:
    """Run `step` warmup times, time it with and without reading each loss, then run it
    `steps` times under the profiler."""
    for _ in range(warmup):
        step().item()
    synced = wall_ms_per_step(step, steps, read_each_loss=True)
    unsynced = wall_ms_per_step(step, steps, read_each_loss=False)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, record_shapes=True
    ) as prof:
        start.record()
        for _ in range(steps):
            step().item()
        end.record()
        torch.cuda.synchronize()
    trace_path = os.path.join(out, f"{label}.trace.json")
    prof.export_chrome_trace(trace_path)
    return {
        "label": label,
        "wall_ms_per_step": synced,
        "wall_ms_per_step_loss_read_once": unsynced,
        "profiled_wall_ms_per_step": start.elapsed_time(end) / steps,
        **kernel_table(prof, steps),
        **idle_gaps(trace_path, steps),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n== {result['label']}: {result['wall_ms_per_step']:.1f} ms/step wall "
        f"({result['wall_ms_per_step_loss_read_once']:.1f} reading only the last loss), "
        f"{result['gpu_ms_per_step']:.1f} ms/step of kernels, GPU idle "
        f"{result['gpu_idle_ms_per_step']:.1f} ms/step under the profiler"
    )
    for name, ms in result["families_ms_per_step"].items():
        print(f"  {name:20} {ms:8.1f} ms")
    for row in result["top_kernels"][:15]:
        print(f"  {row['ms_per_step']:7.2f} ms x{row['calls_per_step']:<6.0f} {row['kernel'][:90]}")
        for origin in row["launched_from"][:1]:
            print(f"        from {origin['origin'][:200]}")
    for gap in result["largest_gaps"][:6]:
        print(f"  idle {gap['ms']:.2f} ms after {gap['after_kernel'][:50]}; host in {gap['host_in'][-2:]}")


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

    import transformers

    report: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.profile_step", *sys.argv[1:]]),
        "gpu_name": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "results": [],
    }
    for label in args.loops:
        step = make_step(label, args.seq_len, args.batch_size)
        report["results"].append(profile_steps(step, args.warmup, args.steps, args.out, label))
        print_table(report["results"][-1])
        del step
        release_memory()
        with open(os.path.join(args.out, "profile.json"), "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
