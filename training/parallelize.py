"""FSDP2 sharding (HSDP across nodes), activation checkpointing and per-layer compilation.

Decoder layers are sharded one by one, then the root, which holds the tied
embedding / lm_head and the final norm in a single unit (sharding the tied
weight in two units would all-gather it twice and break the tie).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config import check_hsdp_replicas
from training.loss import chunk_loss_and_logit_grad_fusable
from training.model import CausalLMWithFusedLoss

# bf16 compute, fp32 gradient reduction and fp32 master weights (torchtitan's default).
MIXED_PRECISION = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def replica_groups(world_size: int, local_world_size: int, hsdp_replicas: int) -> int:
    """HSDP replica groups; 0 means one per node (shard inside a node, replicate across)."""
    replicas = hsdp_replicas or max(1, world_size // max(1, local_world_size))
    check_hsdp_replicas(world_size, replicas)
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
        model.chunk_fn = torch.compile(chunk_loss_and_logit_grad_fusable)
