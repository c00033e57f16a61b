"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from training.config.run_config import TrainConfig

# Parameters AdamW does not decay: norm gains and biases, by the name patterns of HF Trainer's
# `get_decay_parameter_names` (transformers 5.13, trainer.py), which TRL's trainers inherit. For
# Qwen2: every RMSNorm's weight (input_layernorm, post_attention_layernorm, model.norm) and the
# q/k/v projections' biases.
NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's two groups: the weights it decays by `weight_decay`, and the norms and biases
    (`NO_DECAY`), which it does not."""
    decayed: list[nn.Parameter] = []
    kept: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        (kept if NO_DECAY.search(name.lower()) else decayed).append(parameter)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel per parameter group on GPU; no weight decay on norms and biases."""
    on_gpu = device.type == "cuda"
    return torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.lr,
        fused=True if on_gpu else None,
        foreach=None if on_gpu else True,
    )


def schedule_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings `learning_rate` reads for this schedule, by field: what a resumed run must keep
    for its steps to train at the rates of the uninterrupted run. --steps counts only where the
    rate decays towards the last step."""
    keys = ["lr_schedule", "lr", "warmup_steps"]
    if config.lr_schedule != "constant":
        keys += ["steps", "min_lr_ratio"]
    if config.lr_schedule == "wsd":
        keys.append("decay_ratio")
    return {key: getattr(config, key) for key in keys}


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
