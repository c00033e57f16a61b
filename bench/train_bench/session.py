"""The benchmark's process: rank 0 of a real or fake process group with synthetic data and no
checkpoints, the config every case starts from, timing, and freeing memory between cases."""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from training.config.run_config import PRESETS, TrainConfig
from training.data.corpus_cache import in_process_corpus, in_process_rows
from training.data.packing import PackedCorpus
from training.distributed.nodes import gather_nodes, this_node
from training.session import Notice


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

    def checkpoint_folder(self, step: int) -> str:
        raise AssertionError("the benchmark's config writes no checkpoints (benchmark_config)")

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        raise AssertionError("the benchmark's config writes no checkpoints (benchmark_config)")

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.summary, self.history = summary, history

    def nodes(self) -> list[str]:
        return gather_nodes(this_node())

    def faults(self) -> list[dict[str, Any]]:
        return []  # one attempt: the benchmark does not restart

    def preemption_notice(self) -> Notice | None:
        return None  # a benchmark's node is not drained under it

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """Nothing restarts the benchmark: the watchdog's own line is the finding."""


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
        "checkpoint_interval_s": 0.0,  # nor checkpoints, whatever the run's length
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


def timed_steps(step: Callable[[], torch.Tensor], steps: int) -> tuple[float, list[float]]:
    """Median step time after one untimed step, and the losses (read every step, as a loop
    that logs each step's loss does)."""
    losses, times = [step().item()], []
    for _ in range(steps - 1):
        start = time.perf_counter()
        losses.append(step().item())
        times.append(time.perf_counter() - start)
    return statistics.median(times), losses


def alloc_retries(device: torch.device) -> int | None:
    """How often the caching allocator has freed its cache and called cudaMalloc again after one
    failed (each a device-wide synchronisation, the GPU idle meanwhile); None off a GPU."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))


def unless_out_of_memory(run: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any] | None:
    """The run's summary, or None when it ran out of GPU memory.

    Returning rather than handling the error inside the `except` lets the exception and its
    frames, which hold the run's tensors, be freed before the next variant starts.
    """
    try:
        return run(*args)
    except torch.OutOfMemoryError:
        return None
