"""The `throughput` preset's candidates at world size 8 under torch's fake process group: per-rank
peak memory and compute rate, against an L4's budget."""

from __future__ import annotations

from typing import Any

import torch

from bench.train_bench.session import BenchSession, start_process_group
from training.config.run_config import TrainConfig
from training.loop import train

# (overrides of the throughput preset, ranks per node). The preset runs on the 2 x 4
# GPUs of two g6.12xlarge as HSDP (shard 4, replicate 2) or FSDP over all 8.
MEMORY_CASES: dict[str, tuple[dict[str, Any], int]] = {
    f"seq4096x{batch}-{'ac' if ac else 'no-ac'}-{mesh}": (
        {
            "batch_size": batch,
            "activation_checkpointing": ac,
            "hsdp_replicas": 0 if mesh == "hsdp-2x4" else 1,
        },
        4 if mesh == "hsdp-2x4" else 8,
    )
    for batch in (1, 2)
    for ac in (True, False)
    for mesh in ("hsdp-2x4", "fsdp-8")
} | {
    # The preset's shape with 2 micro-batches and --defer-grad-sync: what keeping the whole
    # model's fp32 gradients and gathered layers on every rank costs an L4.
    f"seq4096x2-ac-{mesh}-accum2-deferred": (
        {
            "batch_size": 2,
            "activation_checkpointing": True,
            "hsdp_replicas": 0 if mesh == "hsdp-2x4" else 1,
            "grad_accum_steps": 2,
            "defer_grad_sync": True,
        },
        4 if mesh == "hsdp-2x4" else 8,
    )
    for mesh in ("hsdp-2x4", "fsdp-8")
}
L4_BUDGET_GIB = 20.0


def memory_at_world_size(
    config: TrainConfig, world_size: int, local_world_size: int, device: torch.device
) -> dict[str, Any]:
    start_process_group("fake", world_size, device)
    session = BenchSession(world_size, local_world_size, device)
    train(config, session)
    assert session.summary is not None
    return session.summary
