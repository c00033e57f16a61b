"""The batches a rank trains on: synthetic rows, or the packed rows dealt to the ranks epoch by
epoch, and a run's position in them (epoch, sample offset) for a resume.

Synthetic rows reproduce the reference job (uniform random ids). Each epoch deals the packed rows
to the ranks in a fresh seeded order, so the few rows that do not fill a global batch differ from
epoch to epoch, and a resumed run can replay the exact batches it missed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from training.config.run_config import TrainConfig


class Ranks(Protocol):
    """What `step_batches` reads of a launcher's session (training/session.py `Session`)."""

    rank: int
    world_size: int


def synthetic_batches(
    *,
    seed: int,
    rank: int,
    start_step: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    grad_accum_steps: int = 1,
) -> Iterator[np.ndarray]:
    """Random token rows, `grad_accum_steps` batches per step from step `start_step + 1` on;
    micro-batch m of step k of rank r is the same on every run, so resumed runs match.
    Micro-batch 0 keeps the key of the rows before accumulation existed, (seed, rank, step),
    so runs without accumulation (and their resumes) see the same rows as before."""
    for step in itertools.count(start_step + 1):
        for micro in range(grad_accum_steps):
            key = [seed, rank, step] if micro == 0 else [seed, rank, step, micro]
            generator = np.random.default_rng(key)
            yield generator.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int64)


def steps_per_epoch(
    rows: int, *, world_size: int, batch_size: int, seq_len: int, grad_accum_steps: int = 1
) -> int:
    """Optimizer steps in one pass over the rows; an error when the corpus cannot fill one step."""
    steps = rows // (world_size * batch_size * grad_accum_steps)
    if steps == 0:
        micro = f" x {grad_accum_steps} micro-batches" if grad_accum_steps > 1 else ""
        raise ValueError(
            f"the corpus packs into {rows} rows of {seq_len + 1} tokens: too few for "
            f"{world_size} workers x batch {batch_size}{micro}"
        )
    return steps


def epoch_order(rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The order rows are visited in during one epoch: the same on every rank and every run."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


def epoch_batches(
    rows: np.ndarray,
    *,
    seed: int,
    rank: int,
    world_size: int,
    batch_size: int,
    grad_accum_steps: int = 1,
    start: tuple[int, int] = (0, 0),
) -> Iterator[np.ndarray]:
    """This rank's endless stream of [batch, seq_len + 1] int64 micro-batches, `grad_accum_steps`
    per step. Each epoch takes the rows in `epoch_order` and cuts it into steps of
    `batch_size x world_size x grad_accum_steps` rows (the global batch), from sample `offset` of
    epoch `epoch` (`start`) on; micro-batch m of a step takes the step's rows m x batch_size x
    world_size onwards and deals them to the ranks in turn (row i to rank i mod world). The rows
    left that do not fill a step are left over. So a step trains on the same rows whatever the
    split of its global batch into workers and micro-batches (2 x 1 or 1 x 2), and the position is
    a global sample index: a run resumed on another worker count continues with the rows the
    interrupted one had not reached."""
    steps_per_epoch(
        len(rows),
        world_size=world_size,
        batch_size=batch_size,
        seq_len=rows.shape[1] - 1,
        grad_accum_steps=grad_accum_steps,
    )
    micro = batch_size * world_size
    global_batch = micro * grad_accum_steps
    epoch, offset = start
    while True:
        order = epoch_order(len(rows), seed=seed, epoch=epoch)
        for first in range(offset, len(rows) - global_batch + 1, global_batch):
            for low in range(first, first + global_batch, micro):
                yield rows[order[low + rank : low + micro : world_size]].astype(np.int64)
        epoch, offset = epoch + 1, 0


def position_after(start: tuple[int, int], steps: int, *, rows: int, global_batch: int) -> tuple[int, int]:
    """The (epoch, sample offset) `epoch_batches` reaches after `steps` steps of `global_batch`
    rows from `start`."""
    epoch, offset = start
    left = (rows - offset) // global_batch
    while steps >= left:
        steps -= left
        epoch, offset, left = epoch + 1, 0, rows // global_batch
    return epoch, offset + steps * global_batch


def step_batches(
    config: TrainConfig,
    session: Ranks,
    vocab_size: int,
    start_step: int,
    rows: np.ndarray | None,
    position: Any,
) -> Iterator[np.ndarray]:
    """This rank's micro-batches from step `start_step + 1` on, `--grad-accum-steps` a step:
    synthetic rows (`rows` None), or the packed rows' epochs from `position` (`position_after`)."""
    if rows is None:
        return synthetic_batches(
            seed=config.seed,
            rank=session.rank,
            start_step=start_step,
            batch_size=config.batch_size,
            seq_len=config.seq_len,
            vocab_size=vocab_size,
            grad_accum_steps=config.grad_accum_steps,
        )
    return epoch_batches(
        rows,
        seed=config.seed,
        rank=session.rank,
        world_size=session.world_size,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        start=position,
    )
