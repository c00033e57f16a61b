"""torch's AdamW on the DTensor parameters, the job's optimizer before its step ran on the local
shards (`training.components.optim.ShardLocalAdamW`): the `-dtensor-adamw` variants measure what
that change gained, in the same process as the job's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

import training.build
from training.components.optim import build_optimizer
from training.config.run_config import TrainConfig


def dtensor_adamw(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    adamw: type[torch.optim.AdamW] = torch.optim.AdamW,
) -> torch.optim.Optimizer:
    """torch's AdamW (`adamw`) with the job's groups and kernels (fused on a GPU, foreach on a CPU):
    `build_optimizer` with its default class swapped, in its own signature."""
    return build_optimizer(model, config, device, adamw=adamw)


@contextlib.contextmanager
def with_dtensor_adamw() -> Iterator[None]:
    """`training.build.build` makes `dtensor_adamw` while the block runs, the job's optimizer after."""
    job_optimizer = training.build.build_optimizer
    training.build.build_optimizer = dtensor_adamw
    try:
        yield
    finally:
        training.build.build_optimizer = job_optimizer
