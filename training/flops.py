"""Parameter count, FLOPs per token and MFU, without torch.

FLOPs follow the torchtitan convention used by SPEC §3: `6·N + 12·L·H·S` per
token, N counting the (tied) embedding once. Peaks are dense bf16 tensor-core
rates from the vendors' datasheets (no sparsity).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TFLOPS = 1e12

# Longest key that occurs in torch.cuda.get_device_name() wins, so "L40S" beats "L4"
# and "H100 PCIe" beats "H100".
PEAK_BF16_FLOPS = {
    "B200": 2250 * TFLOPS,
    "GB200": 2500 * TFLOPS,
    "H200 NVL": 835 * TFLOPS,
    "H200": 989 * TFLOPS,
    "GH200": 989 * TFLOPS,
    "H100 NVL": 835 * TFLOPS,
    "H100 PCIe": 756 * TFLOPS,
    "H100": 989 * TFLOPS,
    "H800": 989 * TFLOPS,
    "H20": 148 * TFLOPS,
    "A100": 312 * TFLOPS,
    "A800": 312 * TFLOPS,
    "L40S": 362 * TFLOPS,
    "L40": 181 * TFLOPS,
    "L4": 121 * TFLOPS,
    "A10G": 70 * TFLOPS,  # AWS's variant of the A10, lower clocks; approximate
    "A10": 125 * TFLOPS,
    "A6000": 155 * TFLOPS,
}


def _field(config: Any, name: str, default: Any = None) -> Any:
    """Read a field from a config dict or a transformers config object alike."""
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def num_params(config: Any) -> int:
    """Parameters of a Qwen2-family decoder (q/k/v biases, SwiGLU MLP, RMSNorm)."""
    hidden = _field(config, "hidden_size")
    layers = _field(config, "num_hidden_layers")
    heads = _field(config, "num_attention_heads")
    kv_heads = _field(config, "num_key_value_heads") or heads
    head_dim = _field(config, "head_dim") or hidden // heads
    intermediate = _field(config, "intermediate_size")
    vocab = _field(config, "vocab_size")
    tied = _field(config, "tie_word_embeddings", False)

    q_size = heads * head_dim
    kv_size = kv_heads * head_dim
    attention = hidden * q_size + q_size + 2 * (hidden * kv_size + kv_size) + q_size * hidden
    mlp = 3 * hidden * intermediate
    norms = 2 * hidden
    per_layer = attention + mlp + norms
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * per_layer + embeddings + hidden


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6·N for the weights plus 12·L·H·S for attention scores."""
    hidden = _field(config, "hidden_size")
    layers = _field(config, "num_hidden_layers")
    return 6 * num_params(config) + 12 * layers * hidden * seq_len


def peak_flops(gpu_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s for a device name; None on CPU or an unknown device."""
    if not gpu_name:
        return None
    matches = [key for key in PEAK_BF16_FLOPS if key.lower() in gpu_name.lower()]
    if not matches:
        return None
    return PEAK_BF16_FLOPS[max(matches, key=len)]


def mfu(tokens_per_s_per_gpu: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of the peak, None when the peak is unknown."""
    if peak is None:
        return None
    return tokens_per_s_per_gpu * flops_token / peak
