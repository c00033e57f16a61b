"""FSDP2 sharding (HSDP across nodes), activation checkpointing, float8 linears and per-layer
compilation.

Decoder layers are sharded one by one, then the root, which holds the tied
embedding / lm_head and the final norm in a single unit (sharding the tied
weight in two units would all-gather it twice and break the tie).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config.run_config import check_hsdp_replicas
from training.errors import UsageError
from training.model.causal_lm import CausalLMWithFusedLoss
from training.model.loss import chunk_loss_and_logit_grad_fusable

# bf16 compute, fp32 gradient reduction and fp32 master weights (torchtitan's default).
MIXED_PRECISION = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

# FP8 tensor cores: compute capability 8.9 (Ada: L4) and 9.0 (Hopper: H100, H200), per
# torch._scaled_mm, which torchao's float8 linears call.
FLOAT8_MIN_CAPABILITY = (8, 9)
# torchao's tensorwise recipe: one dynamic scale per tensor for inputs, weights and output
# gradients. Its rowwise recipe was slower on an H200 (bench/reports/rejected-variants_h200_202612.md).
FLOAT8_RECIPE = "tensorwise"


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


def convert_to_float8(model: CausalLMWithFusedLoss, device: torch.device) -> None:
    """Swap the decoder's nn.Linear layers for torchao's float8 training linears (the weights
    stay fp32 masters; each matmul casts its operands to float8 with dynamic scales). The
    lm_head stays bf16: the fused loss multiplies by its weight directly."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < FLOAT8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "a CPU"
        raise UsageError(
            f"--float8 needs FP8 tensor cores (compute capability 8.9+: L4, H100, H200); this is {name}: "
            "pass --no-float8"
        )
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(
        model.causal_lm.model, config=Float8LinearConfig.from_recipe_name(FLOAT8_RECIPE)
    )


def parallelize(
    model: CausalLMWithFusedLoss,
    mesh: DeviceMesh,
    *,
    compile_layers: bool,
    activation_checkpointing: bool,
    reshard_after_forward: bool,
) -> None:
    """Checkpointing and compilation inside each layer, then FSDP2 per layer and at the root
    (after `convert_to_float8`, when float8 is on)."""
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
    # The root is left at FSDP2's default (None), which keeps it gathered after forward: its tied
    # embedding / lm_head is needed again at once by the loss's backward, so resharding it would
    # only all-gather it a second time per micro-batch. Its one floating-point input is the loss
    # normaliser, which must stay fp32: FSDP2 casts floating forward inputs to param_dtype by
    # default, and in bf16 a count like 257 becomes 256, which every loss and gradient carries.
    root_policy = dataclasses.replace(MIXED_PRECISION, cast_forward_inputs=False)
    fully_shard(model, mesh=mesh, mp_policy=root_policy)
    if compile_layers:
        model.chunk_fn = torch.compile(chunk_loss_and_logit_grad_fusable)
