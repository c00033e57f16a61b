"""What a checkpoint costs the steps around it: the loop's own step (`training.loop.train_step`)
with no checkpoint, with one written behind the next steps (`CheckpointWriter`, the loop's path
for every checkpoint before the run's last) and with one written synchronously (`save_checkpoint`,
the run's last), in one process, each variant after the one before on the same model. A
baseline runs first and again last, so drift between them shows.

Each variant runs --steps steps and checkpoints at --checkpoint-at (none for the baselines). A
variant's cost is its extra seconds over the baselines' mean step time, summed over its steps: the
stall and whatever the write behind slows the steps it overlaps. Spread over the time-based
cadence's interval (`checkpoint_interval_s`: --checkpoint-interval-s, lengthened from the
measured stall), that cost is the run's overhead. Run under torchrun, one rank:

    torchrun --standalone --nproc-per-node 1 -m bench.checkpoint_overhead \\
        --out bench/reports/checkpoint-overhead_HW_YYYYMM/overhead.json
    torchrun --standalone --nproc-per-node 1 -m bench.checkpoint_overhead --no-gpu \\
        --model-config tiny --seq-len 128 --batch-size 2 --out /tmp/overhead.json   # a CPU check
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.train_bench.session import BenchSession, benchmark_config
from training.build import build
from training.components.async_checkpoint import (
    MAX_STALL_FRACTION,
    CheckpointWriter,
    checkpoint_interval_s,
    stall_fraction,
)
from training.components.checkpoint import save_checkpoint
from training.config.presets import PRESETS
from training.data.batches import synthetic_batches
from training.distributed.ballot import StepBallot
from training.launch.torchrun_launcher import start_process_group
from training.model.causal_lm import model_batch
from training.step import train_step

VARIANTS = ("baseline", "async", "sync", "baseline-after")
GIB = 1024**3


def overhead_fraction(baseline_s: list[float], measured_s: list[float]) -> float:
    """How much longer, as a share, the measured steps took than as many baseline steps (means:
    a checkpoint's stall falls on one step, which a median would hide)."""
    return statistics.fmean(measured_s) / statistics.fmean(baseline_s) - 1


def extra_seconds(baseline_s: list[float], measured_s: list[float]) -> float:
    """What the measured steps took beyond as many baseline steps: one checkpoint's cost to the run."""
    return sum(measured_s) - statistics.fmean(baseline_s) * len(measured_s)


class _Folders:
    """The writer's session for the benchmark: folders under `root`, published nowhere."""

    rank, world_size = 0, 1

    def __init__(self, root: str) -> None:
        self.root = root
        self.published: list[int] = []

    def checkpoint_folder(self, step: int) -> str:
        path = os.path.join(self.root, f"checkpoint_{step:06d}")
        os.makedirs(path, exist_ok=True)
        return path

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        self.published.append(step)

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        if save is not None:
            save(self.checkpoint_folder(step))


def _folder_gib(path: str) -> float:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file()) / GIB


def _variant(
    name: str, args: argparse.Namespace, parts: dict[str, Any], root: str, first_step: int
) -> dict[str, Any]:
    model, optimizer, config, device = parts["model"], parts["optimizer"], parts["config"], parts["device"]
    batches, folders = parts["batches"], _Folders(root)
    writer = CheckpointWriter(folders, model, optimizer, 0.0, device)
    ballot = StepBallot()
    writer.register(ballot)
    times: list[float] = []
    stalls: list[float] = []  # each checkpoint's: the step's time beyond the baseline's median
    state = {"step": 0, "note": "benchmark: no train state"}
    due_at = {args.checkpoint_at + number * args.checkpoint_every for number in range(args.checkpoints)}
    for index in range(args.steps):
        step = first_step + index
        start = time.perf_counter()
        micro_batches = [model_batch(next(batches), device)]
        writer.cast(ballot)
        train_step(model, optimizer, micro_batches, config.lr, config.max_grad_norm, step=step, ballot=ballot)
        writer.count(ballot)
        due = name in ("async", "sync") and index + 1 in due_at
        last = index + 1 == args.steps
        checkpoint_start = time.perf_counter()
        if name == "sync" and due:
            save_checkpoint(folders.checkpoint_folder(step), model, optimizer, state, 0)
        else:
            writer.report({"step": step}, step, state=state if due else None, last=last, save=None)
        if due:
            stalls.append(time.perf_counter() - checkpoint_start)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    # Closed after every variant (main): torch 2.11's stagers share one copy table that a close
    # clears, so a writer closed here would break the next variant's first write.
    parts["writers"].append(writer)
    written = [entry.path for entry in os.scandir(root)]
    result = {
        "variant": name,
        "checkpoint_steps": sorted(due_at) if name in ("async", "sync") else [],
        "checkpoint_call_s": stalls,  # the report's (async: staging) or save's (sync) own time
        "writer_cost_s": writer.cost_s,  # the last commit's `write_cost_s`, which sizes the interval
        "step_times_s": times,
        "mean_step_s": statistics.fmean(times),
        "median_step_s": statistics.median(times),
        "checkpoint_gib": _folder_gib(written[0]) if written else None,
    }
    for path in written:
        shutil.rmtree(path)
    return result


def _environment(device: torch.device) -> dict[str, Any]:
    import transformers

    return {
        "command": "torchrun --standalone --nproc-per-node 1 -m bench.checkpoint_overhead "
        + shlex.join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--model-config", default="qwen2.5-1.5b")
    parser.add_argument("--seq-len", type=int, default=PRESETS["throughput"]["seq_len"])
    parser.add_argument("--batch-size", type=int, default=PRESETS["throughput"]["batch_size"])
    parser.add_argument("--steps", type=int, default=60, help="steps per variant")
    parser.add_argument("--checkpoint-at", type=int, default=5, help="a variant's first checkpoint's step")
    parser.add_argument("--checkpoint-every", type=int, default=30, help="steps between its checkpoints")
    parser.add_argument("--checkpoints", type=int, default=2, help="checkpoints per variant")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (compilation)")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp folder)")
    parser.add_argument("--no-gpu", action="store_true")
    args = parser.parse_args()

    device = start_process_group(not args.no_gpu, "bench.checkpoint_overhead", "the benchmark")
    config = benchmark_config(
        args.model_config,
        args.warmup_steps + len(VARIANTS) * args.steps,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        use_gpu=device.type == "cuda",
        compile=device.type == "cuda",
    )
    model, optimizer, architecture, _ = build(config, BenchSession(1, 1, device))
    batches = synthetic_batches(
        seed=0,
        rank=0,
        start_step=0,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        vocab_size=architecture.vocab_size,
    )
    for step in range(1, args.warmup_steps + 1):
        train_step(model, optimizer, [model_batch(next(batches), device)], config.lr, 1.0, step=step)
    parts: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "config": config,
        "device": device,
        "batches": batches,
        "writers": [],
    }
    root = tempfile.mkdtemp(prefix="checkpoint-overhead-", dir=args.dir)
    runs = []
    for number, name in enumerate(VARIANTS):
        runs.append(_variant(name, args, parts, root, args.warmup_steps + 1 + number * args.steps))
        print(
            json.dumps({key: value for key, value in runs[-1].items() if key != "step_times_s"}), flush=True
        )
    for writer in parts["writers"]:
        writer.close()
    shutil.rmtree(root)
    baseline = runs[0]["step_times_s"] + runs[-1]["step_times_s"]
    summary: dict[str, Any] = {"baseline_mean_step_s": statistics.fmean(baseline)}
    for run in runs[1:3]:
        extra = extra_seconds(baseline, run["step_times_s"]) / args.checkpoints
        # The default interval, and the one the loop would lengthen it to from this measured cost.
        default = PRESETS["throughput"]["checkpoint_interval_s"]
        interval = checkpoint_interval_s(default, extra)
        summary[run["variant"]] = {
            "overhead_at_these_checkpoints": overhead_fraction(baseline, run["step_times_s"]),
            "extra_s_per_checkpoint": extra,
            "default_interval_s": default,
            "run_overhead_at_default_interval": stall_fraction(extra, default),
            "within_3_percent_at_default_interval": stall_fraction(extra, default) <= MAX_STALL_FRACTION,
            "interval_s": interval,
            "run_overhead_at_interval": stall_fraction(extra, interval),
        }
    record = {
        **_environment(device),
        "model_config": args.model_config,
        "parameters": sum(param.numel() for param in model.parameters()),
        "seq_len": config.seq_len,
        "batch_size": config.batch_size,
        "steps_per_variant": args.steps,
        "checkpoint_at": args.checkpoint_at,
        "checkpoint_every": args.checkpoint_every,
        "runs": runs,
        "summary": summary,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(record, handle, indent=2)
    print(json.dumps(summary, indent=2), flush=True)


if __name__ == "__main__":
    main()
