"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from training.config.run_config import TrainConfig


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
    """The learning rate of step `step` (from 1): a function of the step alone, so resumed runs match.

    A linear warm-up reaches --lr at step --warmup-steps (step 1 trains at lr / warmup). After
    it, `constant` stays at --lr; `linear` and `cosine` decay to --min-lr-ratio x --lr at the
    last step; `wsd` (warmup-stable-decay) stays at --lr, then decays linearly to the same
    minimum over the last --decay-ratio of the steps after the warm-up (rounded up).
    """
    warmup, lr = config.warmup_steps, config.lr
    if step <= warmup:
        return lr * step / warmup
    after = config.steps - warmup
    decay_steps = math.ceil(config.decay_ratio * after) if config.lr_schedule == "wsd" else after
    decay_start = config.steps - decay_steps
    if config.lr_schedule == "constant" or step <= decay_start:
        return lr
    progress = min(1.0, (step - decay_start) / decay_steps)
    floor = config.min_lr_ratio
    if config.lr_schedule == "cosine":
        return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
    return lr * (floor + (1 - floor) * (1 - progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
