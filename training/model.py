"""The model: a Hugging Face causal LM whose forward returns the fused, globally normalised loss."""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.config import TrainConfig, load_model_config
from training.loss import ChunkFn, chunk_loss_and_logit_grad, fused_linear_cross_entropy, global_normalizer


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
        self.causal_lm: Any = causal_lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.chunk_fn: ChunkFn = chunk_loss_and_logit_grad

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.causal_lm.model.layers

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        labels = labels.flatten()
        normalizer = global_normalizer(labels)
        hidden = self.causal_lm.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return fused_linear_cross_entropy(
            hidden.flatten(0, 1),
            self.causal_lm.lm_head.weight,
            labels,
            normalizer,
            self.loss_chunk_tokens,
            self.chunk_fn,
        )


def _fused_attention_forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Qwen2Attention.forward with q, k and v from one matmul over the concatenated weights."""
    from transformers.models.qwen2 import modeling_qwen2

    input_shape = hidden_states.shape[:-1]
    q_size, kv_size = self.q_proj.out_features, self.k_proj.out_features
    weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
    bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
    query, key, value = F.linear(hidden_states, weight, bias).split([q_size, kv_size, kv_size], dim=-1)
    shape = (*input_shape, -1, self.head_dim)
    query, key, value = (part.view(shape).transpose(1, 2) for part in (query, key, value))
    cos, sin = position_embeddings
    query, key = modeling_qwen2.apply_rotary_pos_emb(query, key, cos, sin)
    attention = modeling_qwen2.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling_qwen2.eager_attention_forward
    )
    output, weights = attention(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        sliding_window=self.sliding_window,
        **kwargs,
    )
    return self.o_proj(output.reshape(*input_shape, -1).contiguous()), weights


def _fused_mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """Qwen2MLP.forward with gate and up from one matmul over the concatenated weights."""
    gate, up = F.linear(x, torch.cat([self.gate_proj.weight, self.up_proj.weight])).chunk(2, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def fuse_projections(model: CausalLMWithFusedLoss) -> None:
    """Run each layer's q/k/v and gate/up projections as one matmul each.

    The parameters stay as they are (same state-dict keys, same sharding); only the
    forward concatenates them, so one larger GEMM replaces three (or two) narrower ones,
    the k/v projections (256 wide for Qwen2.5-1.5B) among them.
    """
    for layer in model.decoder_layers:
        attention: Any = layer.self_attn
        mlp: Any = layer.mlp
        attention.forward = MethodType(_fused_attention_forward, attention)
        mlp.forward = MethodType(_fused_mlp_forward, mlp)
