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

    python -m bench.train_bench --out bench/reports/throughput_HW_YYYYMM/run.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import shlex
import sys
from typing import Any

import torch
import torch.distributed as dist

from bench.train_bench.loops import naive_loop, reference_loop, tuned_loop
from bench.train_bench.memory import L4_BUDGET_GIB, MEMORY_CASES, memory_at_world_size
from bench.train_bench.parity import float8_parity, kernel_parity, loss_check
from bench.train_bench.session import (
    alloc_retries,
    benchmark_config,
    emit,
    release_memory,
    unless_out_of_memory,
)
from bench.train_bench.variants import (
    DEFAULT_VARIANTS,
    NAIVE_VARIANTS,
    TUNED_VARIANTS,
    mfu_counts,
    tuned_config,
)
from training.metrics.flops import num_params, peak_flops
from training.metrics.run_metrics import GIB
from training.model.causal_lm import load_architecture


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.train_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    return parser


def new_report(args: argparse.Namespace, architecture: Any, gpu_name: str | None) -> dict[str, Any]:
    """What the report records of the machine and the command, and an empty place for each result."""
    import transformers

    return {
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


class ReportFile:
    """The report, written to --out whole after each result: a run cut short keeps what it measured."""

    def __init__(self, report: dict[str, Any], out: str) -> None:
        self.report, self.out = report, out

    def save(self) -> None:
        with open(self.out, "w") as handle:
            json.dump(self.report, handle, indent=2)

    def add(self, key: str, result: dict) -> None:
        """A result appended to the report's list `key`, printed and saved; its GPU memory released."""
        self.report[key].append(result)
        emit(result)
        self.save()
        release_memory()


def tuned_variant(
    name: str, args: argparse.Namespace, architecture: Any, device: torch.device, gpu_name: str | None
) -> dict[str, Any]:
    """One variant of the tuned loop as the report's row: its numbers, or its error or out of memory."""
    spec = TUNED_VARIANTS[name]
    config = tuned_config(args.model_config, args.steps, spec)
    retries_before = alloc_retries(device) or 0
    try:
        summary = unless_out_of_memory(tuned_loop, config, device, spec)
    except Exception as error:  # a variant that breaks is recorded, not fatal to the run
        return {"name": name, **spec, "error": repr(error)[:500]}
    if summary is None:
        return {"name": name, **spec, "oom": True}
    return {
        "name": name,
        **spec,
        "activation_checkpointing": config.activation_checkpointing,
        "steps": config.steps,
        "step_time_s": summary["step_time_s"],
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary["mfu"],
        "mfu_causal": summary.get("mfu_causal"),
        # The loop's own `mfu_done`, from the attended pairs of the rows it trained on.
        "loop_mfu_done": summary.get("mfu_done"),
        **mfu_counts(architecture, spec, summary["tokens_per_s"], peak_flops(gpu_name)),
        "peak_mem_gib": summary["peak_mem_gib"],
        "alloc_retries": (alloc_retries(device) or 0) - retries_before if device.type == "cuda" else None,
        "loss_first": summary["loss_first"],
        "loss_last": summary["loss_last"],
    }


def memory_case(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One memory case at world size 8 as the report's row, or out of memory under the cap."""
    overrides, local_world_size = MEMORY_CASES[name]
    config = benchmark_config(args.model_config, args.memory_steps, **overrides)
    summary = unless_out_of_memory(memory_at_world_size, config, 8, local_world_size, device)
    if summary is None:
        return {"name": name, "world_size": 8, "oom_under_cap_gib": args.memory_cap_gib}
    return {
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


def print_variants(variants: list[dict[str, Any]]) -> None:
    print(
        f"\n{'variant':52} {'tokens/s':>10} {'MFU':>7} {'done':>7} {'step s':>8} {'peak GiB':>9} {'loss':>15}"
    )
    for row in variants:
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


def print_parities(flex: dict[str, Any] | None, parity: dict[str, Any] | None) -> None:
    if flex:
        print(
            f"flex parity over {flex['steps']} steps: last loss sdpa {flex['loss_last']['sdpa']:.4f}, "
            f"flex {flex['loss_last']['flex']:.4f}; max |difference| {flex['max_abs_difference']:.4f}, "
            f"mean {flex['mean_difference']:+.4f}"
        )
    if parity:
        tail = next(key for key in parity if key.startswith("mean_loss_last_"))
        print(
            f"float8 parity over {parity['steps']} steps: {tail.replace('_', ' ')} "
            f"bf16 {parity[tail]['bf16']:.4f}, float8 {parity[tail]['float8']:.4f} "
            f"({100 * parity['relative_difference_last_steps']:+.2f}%; bf16 seed to seed "
            f"{100 * parity['seed_spread_last_steps']:+.2f}%)"
        )


def print_memory_cases(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if "oom_under_cap_gib" in row:
            print(f"{row['name']:32} out of memory under a {row['oom_under_cap_gib']} GiB cap")
            continue
        print(
            f"{row['name']:32} per-rank peak at world size 8: {row['peak_mem_gib']:.1f} GiB,"
            f" {row['tokens_per_s_per_gpu']:,.0f} tok/s per rank"
        )


def main() -> None:
    args = argument_parser().parse_args()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    architecture = load_architecture(benchmark_config(args.model_config, 1))
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    file = ReportFile(new_report(args, architecture, gpu_name), args.out)
    report = file.report

    report["loss_check"] = loss_check(architecture, device)
    emit(report["loss_check"])
    file.save()

    if not args.skip_reference:
        file.add("variants", reference_loop(architecture, device, args.reference_steps, warmup=5))
    for name in args.naive:
        spec = NAIVE_VARIANTS[name]
        measured = unless_out_of_memory(naive_loop, architecture, device, args.steps, name, spec)
        file.add("variants", measured or {"name": name, **spec, "oom": True})
    for name in args.variants:
        file.add("variants", tuned_variant(name, args, architecture, device, gpu_name))

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
            file.save()

    if args.memory_cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_cap_gib * GIB / total, device)
    for name in args.memory_cases:
        file.add("memory_at_world_size_8", memory_case(name, args, device))

    if dist.is_initialized():
        dist.destroy_process_group()
    print_variants(report["variants"])
    print_parities(report["flex_parity"], report["float8_parity"])
    print_memory_cases(report["memory_at_world_size_8"])


if __name__ == "__main__":
    main()
