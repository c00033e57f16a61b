"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam

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


def _local(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each DTensor's shard on this rank (its storage: an in-place update of it updates the DTensor)."""
    return [tensor.to_local() if isinstance(tensor, DTensor) else tensor for tensor in tensors]


class ShardLocalAdamW(torch.optim.AdamW):
    """torch's AdamW whose step runs its kernels on each rank's local shards.

    AdamW is elementwise, so a sharded parameter's update is its shards' updates, which is what
    DTensor's dispatch computes too. But that dispatch walks every tensor of each fused or foreach
    call on the host (the step counters too, as scalars to replicate): 14 to 16 ms a step for
    Qwen2.5-1.5B's 340 parameters on an H100, while the GPU waits after the step's one host sync
    (bench/reports/mfu_h100_202612.md). The state stays torch's own (DTensors, created by AdamW's
    `_init_group`), so checkpoints hold the same optimizer state as before."""

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("ShardLocalAdamW.step takes no closure")
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            exp_avgs: list[torch.Tensor] = []
            exp_avg_sqs: list[torch.Tensor] = []
            max_exp_avg_sqs: list[torch.Tensor] = []
            steps: list[torch.Tensor] = []
            has_complex = self._init_group(
                group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps
            )
            beta1, beta2 = group["betas"]
            adam(
                _local(params),
                _local(grads),
                _local(exp_avgs),
                _local(exp_avg_sqs),
                _local(max_exp_avg_sqs),
                _local(steps),
                amsgrad=group["amsgrad"],
                has_complex=has_complex,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                foreach=group["foreach"],
                capturable=group["capturable"],
                differentiable=group["differentiable"],
                fused=group["fused"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
            )


def build_optimizer(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    adamw: type[torch.optim.AdamW] = ShardLocalAdamW,
) -> torch.optim.Optimizer:
    """AdamW on the local shards (`ShardLocalAdamW`; `adamw` another AdamW class, as the bench's
    before-and-after variants take torch's), fused into one kernel per parameter group on GPU; no
    weight decay on norms and biases."""
    on_gpu = device.type == "cuda"
    return adamw(
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
