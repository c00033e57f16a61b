"""torch's AdamW on the DTensor parameters, the job's optimizer before its step ran on the local
shards (`training.components.optim.ShardLocalAdamW`): the `-dtensor-adamw` variants measure what
that change gained, in the same process as the job's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

import training.build
from training.components.optim import parameter_groups
from training.config.run_config import TrainConfig


def dtensor_adamw(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """torch's AdamW with the job's groups and kernels (fused on a GPU, foreach on a CPU)."""
    on_gpu = device.type == "cuda"
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.lr,
        fused=True if on_gpu else None,
        foreach=None if on_gpu else True,
    )


@contextlib.contextmanager
def with_dtensor_adamw() -> Iterator[None]:
    """`training.build.build` makes `dtensor_adamw` while the block runs, the job's optimizer after."""
    job_optimizer = training.build.build_optimizer
    training.build.build_optimizer = dtensor_adamw
    try:
        yield
    finally:
        training.build.build_optimizer = job_optimizer
