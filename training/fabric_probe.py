"""`python -m training.fabric_probe`: the bandwidth of the worker group's collectives, as nccl-tests
reports it, in one JSON line.

Each worker runs all_reduce, all_gather and reduce_scatter on float32 buffers at several message
sizes and times them after warm-up calls, on the backend the launcher started (NCCL on GPUs, gloo
on CPU). No model, no data: what the job's FSDP2 collectives can get from the fabric, for a
verdict on the fabric and for forecasting the job's communication. Rates are in gigabits per second
(1e9 bit/s), to hold against a network's line rate; nccl-tests prints GB/s (1e9 bytes/s), 8 times
smaller.

Like the training loop, the measuring code does not know its launcher: Ray Train
(`training.launch.ray_launcher`, on a cluster or `--local`) or torchrun (`--launcher torchrun`), each
handing it a device whose process group is up.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from training.config.flag_types import non_negative_int, positive_float, positive_int
from training.errors import RunFailedError, UsageError
from training.metrics.cloudwatch_sink import publish_busbw

PROGRAM = "python -m training.fabric_probe"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
# The bus bandwidth's share of the algorithm bandwidth for n ranks: the data each rank must send
# and receive per byte of the message at best, whatever the algorithm (NVIDIA/nccl-tests,
# doc/PERFORMANCE.md, "Bus Bandwidth").
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
DTYPE = torch.float32  # nccl-tests' default data type
ELEMENT_BYTES = 4
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
# Message sizes by device type: on GPUs from latency-bound to past 1 GiB, where the rate levels
# off; on CPU (gloo, tests and laptops) small enough to finish in seconds on two shared cores.
DEFAULT_SIZES = {"cuda": (MIB, 16 * MIB, 256 * MIB, GIB), "cpu": (64 * KIB, 256 * KIB, MIB)}
DEFAULT_ITERS = 20  # nccl-tests' default
DEFAULT_WARMUP_ITERS = 5
_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": KIB, "M": MIB, "G": GIB}


def algorithm_bandwidth_gbps(message_bytes: int, seconds: float) -> float:
    """nccl-tests' algbw, the message size over the time of one call, in gigabits per second."""
    return message_bytes * 8 / seconds / 1e9


def bus_bandwidth(collective: str, algbw: float, world_size: int) -> float:
    """nccl-tests' busbw: the algorithm bandwidth scaled to what each rank's link carried, to compare
    with the link's rate whatever the number of ranks (0 for one rank: nothing crosses a link)."""
    return algbw * BUS_FACTORS[collective](world_size)


def message_bytes(requested: int, world_size: int) -> int:
    """The size nearest below `requested` that splits into whole float32 elements per rank (at
    least one each): all_gather's output and reduce_scatter's input are `world_size` equal parts.
    For those two, as in nccl-tests, the size is the whole buffer, not one rank's part."""
    per_rank = max(requested // (ELEMENT_BYTES * world_size), 1)
    return per_rank * world_size * ELEMENT_BYTES


@dataclass(frozen=True)
class ProbeSettings:
    """The probe's flags; the launchers read the worker-group ones (`WorkerGroupSettings`)."""

    local: bool
    launcher: str
    workers: int | None
    use_gpu: bool
    gpus_per_worker: float
    cpus_per_worker: float
    sizes: tuple[int, ...] | None
    iters: int
    warmup_iters: int


def _sizes(text: str) -> tuple[int, ...]:
    sizes = []
    for item in text.split(","):
        match = _SIZE.fullmatch(item.strip())
        if not match or int(match[1]) == 0:
            raise argparse.ArgumentTypeError(
                f"expected sizes in bytes > 0 separated by commas, each with an optional K, M or G "
                f"(binary: 1K = 1024), e.g. 1M,64M,1G; got {text!r}"
            )
        sizes.append(int(match[1]) * _UNITS[match[2].upper()])
    return tuple(sizes)


def _shown_sizes(sizes: tuple[int, ...]) -> str:
    def shown(size: int) -> str:
        unit = next(unit for unit in ("G", "M", "K", "") if size % _UNITS[unit] == 0)
        return f"{size // _UNITS[unit]}{unit}"

    return ",".join(map(shown, sizes))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description=(
            "Time all_reduce, all_gather and reduce_scatter over the worker group and print one JSON "
            "line: the world size and, per collective and message size, the algorithm and bus "
            "bandwidths as nccl-tests defines them, in Gbit/s."
        ),
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="start an embedded Ray in this process instead of joining a cluster",
    )
    parser.add_argument(
        "--launcher",
        choices=("ray", "torchrun"),
        default="ray",
        help="ray: a Ray Train worker group; torchrun: run under torchrun, no Ray (default: ray)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        help="Ray workers (default: one per GPU of the cluster; required with --no-gpu)",
    )
    parser.add_argument(
        "--use-gpu",
        "--gpu",
        action=argparse.BooleanOptionalAction,
        help="NCCL between GPUs, or gloo between CPU processes (default: GPUs, except with --local or "
        "torchrun on a machine without CUDA)",
    )
    parser.add_argument(
        "--gpus-per-worker",
        type=positive_float,
        default=1.0,
        help="GPUs each Ray worker reserves (default: 1)",
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=positive_float,
        default=1.0,
        help="CPUs each Ray worker reserves (default: 1)",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        help="message sizes in bytes, K/M/G binary (default: "
        + "; ".join(f"{_shown_sizes(sizes)} on {device.upper()}" for device, sizes in DEFAULT_SIZES.items())
        + ")",
    )
    parser.add_argument(
        "--iters",
        type=positive_int,
        default=DEFAULT_ITERS,
        help=f"timed calls per collective and size (default: {DEFAULT_ITERS})",
    )
    parser.add_argument(
        "--warmup-iters",
        type=non_negative_int,
        default=DEFAULT_WARMUP_ITERS,
        help=f"untimed calls before them (default: {DEFAULT_WARMUP_ITERS})",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> ProbeSettings:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.local and args.launcher == "torchrun":
        parser.error("--local starts an embedded Ray; it does not combine with --launcher torchrun")
    use_gpu = args.use_gpu
    if use_gpu is None:
        # The embedded Ray and torchrun use this machine; a cluster is for its GPUs.
        use_gpu = torch.cuda.is_available() if args.local or args.launcher == "torchrun" else True
    return ProbeSettings(
        local=args.local,
        launcher=args.launcher,
        workers=args.workers,
        use_gpu=use_gpu,
        gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker,
        sizes=args.sizes,
        iters=args.iters,
        warmup_iters=args.warmup_iters,
    )


def _wait_for_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _line_up(device: torch.device) -> None:
    """Every rank here and its device idle: a barrier that needs no device id from the launcher."""
    dist.all_reduce(torch.zeros(1, device=device))
    _wait_for_device(device)


def _gather_and_scatter() -> tuple[Callable[..., object], Callable[..., object]]:
    """all_gather and reduce_scatter on single tensors: torch 2.13's names (the pin), else the
    ones of the GPU benchmark machine's torch 2.11, which 2.13 deprecates."""
    return (
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor),
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor),
    )


def _collective_call(
    collective: str, size: int, world_size: int, device: torch.device
) -> Callable[[], object]:
    """One call of `collective` on a message of `size` bytes (buffers made once, reused)."""
    whole = torch.zeros(size // ELEMENT_BYTES, dtype=DTYPE, device=device)  # sums stay finite
    part = torch.zeros(size // ELEMENT_BYTES // world_size, dtype=DTYPE, device=device)
    all_gather, reduce_scatter = _gather_and_scatter()
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(whole),
        "all_gather": lambda: all_gather(whole, part),
        "reduce_scatter": lambda: reduce_scatter(part, whole),
    }
    return calls[collective]


def _seconds_per_call(call: Callable[[], object], device: torch.device, settings: ProbeSettings) -> float:
    """Wall-clock time of one call as nccl-tests measures it: from a barrier to the device's last
    completion over the timed calls, divided by their number and averaged over the ranks."""
    for _ in range(settings.warmup_iters):
        call()
    _line_up(device)
    start = time.perf_counter()
    for _ in range(settings.iters):
        call()
    _wait_for_device(device)
    elapsed = torch.tensor(
        [(time.perf_counter() - start) / settings.iters], dtype=torch.float64, device=device
    )
    dist.all_reduce(elapsed)
    return elapsed.item() / dist.get_world_size()


def measure(device: torch.device, settings: ProbeSettings) -> dict[str, Any] | None:
    """Every rank's part of the probe; rank 0 returns the report."""
    world_size = dist.get_world_size()
    rows = []
    for collective in COLLECTIVES:
        for requested in settings.sizes or DEFAULT_SIZES[device.type]:
            size = message_bytes(requested, world_size)
            seconds = _seconds_per_call(
                _collective_call(collective, size, world_size, device), device, settings
            )
            algbw = algorithm_bandwidth_gbps(size, seconds)
            rows.append(
                {
                    "collective": collective,
                    "bytes": size,
                    "algbw_gbps": algbw,
                    "busbw_gbps": bus_bandwidth(collective, algbw, world_size),
                }
            )
    if dist.get_rank() != 0:
        return None
    # The calls made of each collective and size: what the fabric gate holds the EFA counters to.
    return {
        "world_size": world_size,
        "iters": settings.iters,
        "warmup_iters": settings.warmup_iters,
        "results": rows,
    }


def _run_torchrun(settings: ProbeSettings) -> dict[str, Any] | None:
    from training.distributed.rank_exit import tear_down_process_group
    from training.launch.torchrun_launcher import start_process_group

    device = start_process_group(settings.use_gpu, "training.fabric_probe", "--use-gpu measures")
    report = measure(device, settings)
    tear_down_process_group()
    return report


def _run(settings: ProbeSettings) -> int:
    try:
        if settings.launcher == "torchrun":
            report = _run_torchrun(settings)
        else:
            from training.launch.ray_launcher import run_on_workers

            report = run_on_workers(settings, measure, settings)
            if report is None:
                raise RunFailedError("rank 0 returned no report")
    except UsageError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr)
        return 2
    except RunFailedError as error:
        print(f"fabric probe failed: {error}", file=sys.stderr)
        return 1
    if report is not None:
        print(json.dumps(report, separators=(",", ":")), flush=True)
        publish_busbw(report)  # CloudWatch, with the cluster's name in the environment
    return 0


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    exit_code = _run(settings)
    if settings.launcher == "torchrun":
        from training.distributed.rank_exit import end_rank_process

        end_rank_process(exit_code)  # a torchrun rank ends here (training.distributed.rank_exit says why)
    return exit_code


if __name__ == "__main__":
    # Call this module under its package name, so Ray workers import `measure` from it rather than
    # unpickle a copy of this `__main__`.
    from training.fabric_probe import main as package_main

    sys.exit(package_main())
