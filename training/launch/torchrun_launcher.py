"""torchrun launcher: the same loop without Ray (the GPU benchmark machine has none).

Ranks come from torchrun's environment; checkpoints are DCP folders under
`<storage-path>/<run-name>/` on a filesystem every rank can see, and so is the corpus
cache, which one rank packs while the others wait for it (training/data/corpus_cache.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.components.checkpoint import (
    CHECKPOINT_PREFIX,
    CHECKPOINT_SCORE,
    checkpoint_name,
    checkpoints_kept,
    is_complete,
    read_train_state,
    resume_point,
)
from training.components.drain import DRAINED_EXIT_CODE, install_sigterm_notice, sigterm_received
from training.config.run_config import TrainConfig
from training.data.corpus_cache import in_process_corpus
from training.data.packing import PackedCorpus
from training.distributed.nodes import gather_nodes, this_node
from training.distributed.rank_exit import end_rank_process, tear_down_process_group
from training.errors import UsageError
from training.metrics.artifacts import closing_line, write_run_files
from training.metrics.report import format_summary
from training.session import Notice


class TorchrunSession:
    """The loop's view of a torchrun rank."""

    def __init__(self, config: TrainConfig, device: torch.device) -> None:
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.device = device
        self.run_dir = Path(config.storage_path) / config.run_name
        self.resume_from = config.resume_from
        self.keep_checkpoints = config.keep_checkpoints
        self.drained_from: int | None = None  # the step of the first checkpoint after a SIGTERM

    def _checkpoints(self) -> list[Path]:
        found = self.run_dir.glob(f"{CHECKPOINT_PREFIX}*") if self.run_dir.is_dir() else []
        return sorted(path for path in found if is_complete(str(path)))

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        """The newest complete checkpoint of the run if whole, else the newest whole one before it,
        said in one line; without any, --resume-from."""
        checkpoints = self._checkpoints()
        if not checkpoints:
            yield self.resume_from
            return
        point = resume_point(str(checkpoints[-1]), str(self.run_dir))
        if point.line is not None and self.rank == 0:
            print(point.line, flush=True)
        yield point.location

    @contextlib.contextmanager
    def open_checkpoint(self, location: str) -> Iterator[str]:
        yield location  # torchrun reads local folders only

    def corpus(self, config: TrainConfig) -> PackedCorpus:
        return in_process_corpus(config)

    def eval_rows(self, config: TrainConfig) -> PackedCorpus:
        assert config.eval_data is not None
        return in_process_corpus(config, config.eval_data, "--eval-data")

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        if save is None:
            return
        path = self.checkpoint_folder(step)
        save(path)
        self.publish(metrics, step, path)

    def checkpoint_folder(self, step: int) -> str:
        """The shared folder every rank writes its shards into; not complete (`is_complete`) before
        rank 0 writes its train state into it."""
        path = self.run_dir / checkpoint_name(step)
        path.mkdir(parents=True, exist_ok=True)
        if self.drained_from is None and sigterm_received():
            self.drained_from = step  # the first checkpoint begun after torchrun's SIGTERM
        return str(path)

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        """Rank 0 keeps --keep-checkpoints of the complete ones, once every rank is past the commit,
        and removes the folders of earlier steps that never completed (writes a killed run left)."""
        dist.barrier()
        if _all_agree(self.device, self.drained_from is not None and step >= self.drained_from):
            # torchrun SIGTERMs every rank and SIGKILLs them 30 s later: end with the checkpoint the
            # SIGTERM brought (not one begun before it and committed since).
            if self.rank == 0:
                print(
                    f"SIGTERM: checkpoint of step {step} committed ({folder}); the same torchrun command "
                    "resumes from it",
                    flush=True,
                )
            end_rank_process(DRAINED_EXIT_CODE)
        if self.rank == 0:
            for path in self.run_dir.glob(f"{CHECKPOINT_PREFIX}*"):
                written = path.name.removeprefix(CHECKPOINT_PREFIX)
                if written.isdigit() and int(written) < step and not is_complete(str(path)):
                    shutil.rmtree(path)
            checkpoints = self._checkpoints()
            scores = [read_train_state(str(path)).get(CHECKPOINT_SCORE) for path in checkpoints]
            kept = checkpoints_kept(scores, self.keep_checkpoints)
            for index, stale in enumerate(checkpoints):
                if index not in kept:
                    shutil.rmtree(stale)

    def nodes(self) -> list[str]:
        return gather_nodes(this_node())

    def faults(self) -> list[dict[str, Any]]:
        return []  # torchrun restarts no rank: a failed run is rerun with the same --run-name

    def preemption_notice(self) -> Notice | None:
        return None  # a drain reaches each rank as torchrun's SIGTERM (`install_sigterm_notice`)

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """Nothing restarts the run to read it: the watchdog's own line is the finding."""

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        if self.rank != 0:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)

        def write(name: str, data: bytes) -> None:
            (self.run_dir / name).write_bytes(data)

        completed = write_run_files(write, str(self.run_dir), summary, history)
        print(format_summary(completed), flush=True)
        print(closing_line(completed), flush=True)


def _all_agree(device: torch.device, mine: bool) -> bool:
    """Whether every rank holds `mine` true (one all-reduce, at checkpoints only)."""
    flag = torch.tensor([1.0 if mine else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def start_process_group(use_gpu: bool, module: str, gpu_user: str) -> torch.device:
    """This torchrun rank's device, its process group started: NCCL on its GPU, or gloo on CPU.
    `module` is what torchrun runs, `gpu_user` what wants the GPUs (for the error lines)."""
    if "RANK" not in os.environ:
        raise UsageError(f"--launcher torchrun needs torchrun: torchrun --nproc-per-node=N -m {module} ...")
    if not use_gpu:
        dist.init_process_group("gloo")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"{gpu_user} on GPUs and this machine has none: pass --no-gpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def run(config: TrainConfig) -> None:
    """Entry point of each torchrun rank."""
    from training.loop import train

    device = start_process_group(config.use_gpu, "training", f"--preset {config.preset} trains")
    install_sigterm_notice()  # torchrun forwards its SIGTERM to every rank: checkpoint, then train on
    train(config, TorchrunSession(config, device))
    tear_down_process_group()
