"""The model, its FSDP2 sharding and its optimizer.

Decoder layers are sharded one by one, then the root, which holds the tied
embedding / lm_head and the final norm in a single unit (sharding the tied
weight in two units would all-gather it twice and break the tie).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config import TrainConfig, load_model_config
from training.loss import chunk_loss_and_logit_grad, fused_linear_cross_entropy

MIXED_PRECISION = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def load_architecture(config: TrainConfig) -> Any:
    """The transformers config of the model to train (shipped JSON for random init)."""
    from transformers import AutoConfig

    if config.init == "pretrained":
        return AutoConfig.from_pretrained(config.model_id)
    values = load_model_config(config.model_config)
    return AutoConfig.for_model(**values)


def build_causal_lm(config: TrainConfig, architecture: Any, device: torch.device) -> nn.Module:
    """fp32 master weights: random (same seed on every rank) or the model id's pretrained ones."""
    from transformers import AutoModelForCausalLM

    if config.init == "pretrained":
        # Loaded on the host; fully_shard moves each rank's shard to its device.
        return AutoModelForCausalLM.from_pretrained(
            config.model_id, config=architecture, dtype=torch.float32, attn_implementation="sdpa"
        )
    torch.manual_seed(config.seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(architecture, dtype=torch.float32, attn_implementation="sdpa")


class CausalLMWithFusedLoss(nn.Module):
    """A Hugging Face causal LM whose forward returns the loss through the fused lm_head."""

    def __init__(self, causal_lm: nn.Module, loss_chunk_tokens: int):
        super().__init__()
        self.causal_lm = causal_lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.chunk_fn = chunk_loss_and_logit_grad

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.causal_lm.model.layers

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = self.causal_lm.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return fused_linear_cross_entropy(
            hidden.flatten(0, 1),
            self.causal_lm.lm_head.weight,
            labels.flatten(),
            self.loss_chunk_tokens,
            self.chunk_fn,
        )


def replica_groups(world_size: int, local_world_size: int, hsdp_replicas: int) -> int:
    """HSDP replica groups; 0 means one per node (shard inside a node, replicate across)."""
    replicas = hsdp_replicas or max(1, world_size // max(1, local_world_size))
    if world_size % replicas:
        raise ValueError(f"world size {world_size} is not a multiple of {replicas} HSDP replica groups")
    return replicas


def build_mesh(device_type: str, world_size: int, replicas: int) -> DeviceMesh:
    """1-D mesh for FSDP, 2-D (replicate, shard) for HSDP."""
    if replicas == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(
        device_type, (replicas, world_size // replicas), mesh_dim_names=("replicate", "shard")
    )


def parallelize(
    model: CausalLMWithFusedLoss,
    mesh: DeviceMesh,
    *,
    compile_layers: bool,
    activation_checkpointing: bool,
    reshard_after_forward: bool,
) -> None:
    """Checkpointing and compilation inside each layer, then FSDP2 per layer and at the root."""
    if activation_checkpointing:
        model.causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = model.decoder_layers
    for index, layer in enumerate(layers):
        if compile_layers:
            # Compile the forward only: FSDP's hooks stay outside the graph and the
            # state-dict keys stay those of the plain model.
            layer.forward = torch.compile(layer.forward)
        # Backward starts with the last layer, so freeing it after forward only re-gathers it.
        last = index == len(layers) - 1
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=MIXED_PRECISION,
            reshard_after_forward=reshard_after_forward and not last,
        )
    fully_shard(model, mesh=mesh, mp_policy=MIXED_PRECISION, reshard_after_forward=reshard_after_forward)
    if compile_layers:
        model.chunk_fn = torch.compile(chunk_loss_and_logit_grad)


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel per parameter group on GPU."""
    implementation = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, **implementation
    )


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then constant: depends on the step alone, so resumed runs match."""
    if config.warmup_steps and step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    return config.lr
