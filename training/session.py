"""What a launcher provides to the training loop (`Session`), and how the loop writes a console line.

The loop (training/loop.py) talks to its launcher only through a `Session` (rank, device,
checkpoints, corpus, reporting), so it never needs to know which launcher it runs in: Ray Train's
`training.launch.ray_launcher.RaySession` or torchrun's `training.launch.torchrun_launcher`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from training.config.run_config import TrainConfig
from training.data.packing import PackedCorpus


@dataclass(frozen=True)
class Notice:
    """Why the run's node goes away and by when (epoch seconds; None: the sender's grace period)."""

    source: str
    deadline: float | None = None


class Session(Protocol):
    """What a launcher provides to the loop."""

    rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    def latest_checkpoint(self) -> AbstractContextManager[str | None]:
        """A folder holding the newest complete checkpoint, or None."""

    def open_checkpoint(self, location: str) -> AbstractContextManager[str]:
        """The checkpoint at `location` (--init-from) as a local folder."""

    def corpus(self, config: TrainConfig) -> PackedCorpus:
        """All packed [rows, seq_len + 1] rows of the corpus `config.data`, in corpus order, their
        fingerprint and what packing did."""

    def eval_rows(self, config: TrainConfig) -> PackedCorpus | np.ndarray:
        """All packed [rows, seq_len + 1] rows of the held-out corpus `config.eval_data`, with what
        packing did (a PackedCorpus), or the rows alone."""

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        """Publish a step's metrics; `save(folder)` writes a checkpoint when one is due."""

    def checkpoint_folder(self, step: int) -> str:
        """Where this rank writes step's checkpoint behind the next steps; no checkpoint until
        `publish` (training/components/async_checkpoint.py)."""

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        """The step's report, with the completed checkpoint of `step` written into `folder`."""

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Publish the run summary and per-step history."""

    def nodes(self) -> list[str]:
        """Each rank's node in this attempt, by rank: a collective every rank calls at its start. A
        launcher that restarts keeps them where its record of faults reads them."""

    def faults(self) -> list[dict[str, Any]]:
        """The faults the launcher restarted this run after, oldest first
        (`training.components.attempts`); [] for one that does not restart a run."""

    def preemption_notice(self) -> Notice | None:
        """The cluster's notice that a node of the run is being drained, or None; a barrier every
        rank calls at the same step (`training.components.drain.DrainWatch`). None always for a
        launcher whose drain is the rank's own SIGTERM."""

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """Keep the hang watchdog's finding where the launcher's restart record reads it (a no-op
        for a launcher that does not restart)."""


def emit(line: str) -> None:
    """Write a console line. Not print(): Ray Train replaces print in workers with a
    logger that echoes every line to stderr too, which would double each step line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
