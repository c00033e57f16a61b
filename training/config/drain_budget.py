"""What a drain's checkpoint takes, and the grace that holds it: plain arithmetic without torch, so the
job (the drain's choice, `training.components.async_checkpoint`) and the preview (the worker pods'
`terminationGracePeriodSeconds` and Ray's drain timeout, `infra`) reckon with the same figures.

A node's checkpoint is its share of the model and AdamW state (`CHECKPOINT_BYTES_PER_PARAMETER`; DCP
stores a replica once, so FSDP and HSDP alike put 1/nodes of it on each node), written by each of its
ranks straight to S3 as one stream. A drain's worst case has a periodic write just begun: the notice
reaches the loop, the step ends, the write in flight finishes and commits, and no new write is started
(`drain_choice`: with one link and equal writes, a new write would end after the one in flight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from training.config.deadline_margin import CHECKPOINT_BYTES_PER_PARAMETER

# One rank's write to S3, one stream: AWS's S3 performance guidelines size one concurrent request
# for each 85-90 MB/s of throughput wanted ("Performance guidelines for Amazon S3", Measure
# performance); the low end, so the estimate errs slow.
STREAM_BYTES_PER_S = 85e6
# Staging to CPU memory before the write: the first, freshly pinned, copy of 18.1 GiB took 7.87 s on an
# H100 (bench/reports/checkpoint-overhead_cpu-h100_202612.md), 2.4 GB/s; a kept stager is faster.
STAGE_BYTES_PER_S = 2.4e9
# From the node's drain to the loop acting on it: Ray Train's preemption watcher polls every second
# (RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S, the Ray launcher's) and the loop every 2 s (drain.POLL_EVERY_S).
NOTICE_S = 3.0
# The commit after the write: the metadata read and each shard's size checked, rank 0's train state,
# every rank's report to Ray Train's controller (0.25 s polls).
COMMIT_S = 5.0
# The grace is the worst case times this, plus Ray's own stop (`RAY_STOP_MARGIN_S`).
GRACE_MARGIN = 1.5
# Ray stops each of a node's processes after the drain, up to a second each, about half a dozen on a
# worker (ray/_private/node.py, `_kill_process_impl`): the drain ends this long before the SIGKILL.
RAY_STOP_MARGIN_S = 10
# The grace no drain gets more of: when EKS deletes or scales in a managed node group it drains each
# node, and "if the node hasn't been drained after 5 minutes, Amazon EKS lets Auto Scaling continue
# the forced termination of the instance" (EKS User Guide, "Delete a managed node group").
MAX_GRACE_S = 300
# Kubernetes' own default grace, which a worker never gets less of.
MIN_GRACE_S = 30
# The grace is a whole number of these: a small change of the planner's step time keeps the pods'
# spec, which a new grace would roll (and run the job again).
GRACE_STEP_S = 30
# A worker's grace where the stack runs no training job (`train: false`): the drain has nothing to save.
DEFAULT_GRACE_S = 120


def write_s(bytes_per_rank: float, rate_bytes_per_s: float = STREAM_BYTES_PER_S) -> float:
    """One rank's write of its shards, all ranks of a node writing at once, each its own stream."""
    return bytes_per_rank / rate_bytes_per_s


@dataclass(frozen=True)
class DrainBudget:
    """A node's drain: its checkpoint's bytes, each phase's seconds, the worst case (a write just
    begun when the notice came), and the grace and Ray drain timeout set from it."""

    bytes_per_node: float
    ranks_per_node: int
    step_s: float
    stage_s: float
    write_s: float

    @property
    def worst_s(self) -> float:
        """Notice, the step, then a periodic write begun just before: its staging, write and commit."""
        return NOTICE_S + self.step_s + self.stage_s + self.write_s + COMMIT_S

    @property
    def grace_s(self) -> int:
        """The worst case with its margin and Ray's stop, rounded up to `GRACE_STEP_S`."""
        needed = self.worst_s * GRACE_MARGIN + RAY_STOP_MARGIN_S
        return max(MIN_GRACE_S, GRACE_STEP_S * math.ceil(needed / GRACE_STEP_S))

    @property
    def drain_timeout_s(self) -> int:
        """Ray's drain (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S): the grace less Ray's stop."""
        return self.grace_s - RAY_STOP_MARGIN_S

    @property
    def fits(self) -> bool:
        return self.grace_s <= MAX_GRACE_S


def drain_budget(
    parameters: int,
    nodes: int,
    ranks_per_node: int,
    step_s: float,
    rate_bytes_per_s: float = STREAM_BYTES_PER_S,
) -> DrainBudget:
    """The drain of one of `nodes` nodes training a model of `parameters` with AdamW."""
    per_node = parameters * CHECKPOINT_BYTES_PER_PARAMETER / nodes
    return DrainBudget(
        bytes_per_node=per_node,
        ranks_per_node=ranks_per_node,
        step_s=step_s,
        stage_s=per_node / ranks_per_node / STAGE_BYTES_PER_S,
        write_s=write_s(per_node / ranks_per_node, rate_bytes_per_s),
    )


@dataclass(frozen=True)
class DrainChoice:
    """What a drain notice makes the checkpoint writer do, the same on every rank: commit the write in
    flight and start none (`commit_in_flight`), start the drain's own write (`write`), or neither,
    when nothing can commit before the deadline."""

    commit_in_flight: bool
    write: bool


def drain_choice(left_s: float | None, in_flight_left_s: float | None, next_write_s: float) -> DrainChoice:
    """`left_s`: seconds to the drain's deadline (None: the sender's grace, unknown); `in_flight_left_s`:
    what the write in flight still needs (None: none in flight); `next_write_s`: a new write's staging
    and write. A write in flight that can commit in time is committed and nothing new started; with
    none in flight, the drain's own write starts if it can commit in time. A write in flight that
    cannot commit in time is dropped, and no new one is started: with one link and writes of one
    size, a new write would end after it. Without a deadline (a SIGTERM under torchrun, whose sender
    waits its own grace), the write in flight is committed and the drain's own write started."""
    if left_s is None:
        return DrainChoice(in_flight_left_s is not None, True)
    if in_flight_left_s is not None:
        return DrainChoice(in_flight_left_s + COMMIT_S <= left_s, False)
    return DrainChoice(False, next_write_s + COMMIT_S <= left_s)
