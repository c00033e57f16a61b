"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

import torch
from torch import nn

from training.config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel per parameter group on GPU."""
    on_gpu = device.type == "cuda"
    return torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        weight_decay=config.weight_decay,
        fused=True if on_gpu else None,
        foreach=None if on_gpu else True,
    )


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then constant: depends on the step alone, so resumed runs match."""
    if config.warmup_steps and step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    return config.lr


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
