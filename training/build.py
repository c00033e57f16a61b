"""The model a run trains: its architecture checked against the flags, sharded over the device
mesh, its weights read shard by shard (pretrained) or broadcast from rank 0 (random), and its
optimizer."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from training.components.optim import build_optimizer
from training.config.run_config import TrainConfig
from training.data.tokenizer import load_tokenizer
from training.distributed.parallelize import build_mesh, convert_to_float8, parallelize, replica_groups
from training.model.attention import attention_kernel
from training.model.causal_lm import (
    CausalLMWithFusedLoss,
    build_causal_lm,
    build_meta_causal_lm,
    load_architecture,
    load_shards_from_checkpoint,
    shard_weights_from_rank0,
)
from training.session import Session, emit


def _check_fits(config: TrainConfig, architecture: Any) -> None:
    limit = getattr(architecture, "max_position_embeddings", None)
    if limit is not None and config.seq_len > limit:
        raise ValueError(f"seq_len {config.seq_len} exceeds the model's max_position_embeddings {limit}")
    if not config.synthetic_data or config.eval_data is not None:
        tokens = load_tokenizer(config.tokenizer).vocab_size
        if tokens > architecture.vocab_size:
            raise ValueError(f"tokenizer has {tokens} tokens, the model only {architecture.vocab_size}")


def build(
    config: TrainConfig, session: Session, resuming: bool = False
) -> tuple[CausalLMWithFusedLoss, torch.optim.Optimizer, Any, int]:
    """The sharded model, its optimizer, the architecture and the HSDP replica count. A
    pretrained model is read shard by shard on each rank, never whole; a random one is rank 0's.
    `resuming`: a checkpoint's weights replace the built ones, so the pretrained ones are not read."""
    architecture = load_architecture(config)
    _check_fits(config, architecture)
    replicas = replica_groups(session.world_size, session.local_world_size, config.hsdp_replicas)
    mesh = build_mesh(session.device.type, session.world_size, replicas)
    kernel, flex_tiles = attention_kernel(
        config, architecture, session.device, emit if session.rank == 0 else lambda line: None
    )
    config = dataclasses.replace(config, attention=kernel)
    # A checkpoint's or --init-from's weights replace the built ones: random ones cost no download.
    replaced = resuming or config.init_from is not None
    weights_from = dataclasses.replace(config, init="random") if replaced else config
    per_shard = weights_from.init == "pretrained"
    # A random init stays rank 0's seeded full model, broadcast: one RNG stream over the full
    # tensors, so the model is the same bits whatever the world size or mesh.
    source = (
        None
        if per_shard or session.rank != 0
        else build_causal_lm(weights_from, architecture, session.device)
    )
    model = CausalLMWithFusedLoss(
        build_meta_causal_lm(config, architecture), config.loss_chunk_tokens, flex_tiles
    )
    if config.float8:
        convert_to_float8(model, session.device)
    parallelize(
        model,
        mesh,
        compile_layers=config.compile,
        activation_checkpointing=config.activation_checkpointing,
        reshard_after_forward=config.reshard_after_forward,
    )
    if per_shard:
        load_shards_from_checkpoint(model, config.model_id, session.device)
    else:
        shard_weights_from_rank0(model, source, session.device)
    del source
    model.train()
    return model, build_optimizer(model, config, session.device), architecture, replicas
