"""Parameter count, FLOPs per token and MFU, without torch.

Model FLOPs per token follow the PaLM paper (Chowdhery et al. 2022, appendix B)
and torchtitan: 6·N + 12·L·H·S, where N counts the parameters that take part
in a matmul (an untied input embedding is a lookup and is left out; a tied one
is counted once, as the lm_head), L is the number of layers, H the attention
width heads × head_dim and S the sequence length. The attention term is not
halved for causal masking; `causal=True` gives the halved value. Peaks are
dense bf16 tensor-core rates (FP32 accumulate, no sparsity) from the vendors'
datasheets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TFLOPS = 1e12

# The longest key that occurs as a whole word in torch.cuda.get_device_name() wins, so
# "H100 PCIe" beats "H100".
PEAK_BF16_FLOPS = {
    "B200": 2250 * TFLOPS,
    "GB200": 2500 * TFLOPS,
    "H200 NVL": 835 * TFLOPS,
    "H200": 989 * TFLOPS,
    "GH200": 989 * TFLOPS,
    "H100 NVL": 835 * TFLOPS,
    "H100 PCIe": 756 * TFLOPS,
    "H100": 989 * TFLOPS,
    "H800 PCIe": 756 * TFLOPS,
    "H800": 989 * TFLOPS,
    "H20": 148 * TFLOPS,
    "A100": 312 * TFLOPS,
    "A800": 312 * TFLOPS,
    "L40S": 362 * TFLOPS,
    "L40": 181 * TFLOPS,
    "L4": 121 * TFLOPS,
    "A10G": 70 * TFLOPS,  # AWS's variant of the A10, lower clocks; approximate
    "A10": 125 * TFLOPS,
    "A40": 149.7 * TFLOPS,
    "A6000": 155 * TFLOPS,
    # 142 SMs x 2.505 GHz x 1024 dense bf16 FLOP per SM per clock; the datasheet's
    # 1,457 FP8 TFLOPS with sparsity is four times this.
    "RTX 6000 Ada": 364.2 * TFLOPS,
}
# A MIG instance is a slice of the GPU; CUDA names it after the GPU with "MIG" and the
# profile appended (e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"), and the whole GPU's peak
# would understate its MFU several times over.
MIG_MARKER = "MIG"


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


def matmul_params(config: Any) -> int:
    """Parameters that take part in a matmul: all but an untied input embedding."""
    tied = _field(config, "tie_word_embeddings", False)
    lookup = 0 if tied else _field(config, "vocab_size") * _field(config, "hidden_size")
    return num_params(config) - lookup


def flops_per_token(config: Any, seq_len: int, causal: bool = False, attended: float | None = None) -> float:
    """Training FLOPs per token: 6·N for the weights plus 12·L·H·S for attention scores
    (6·L·H·S with `causal`, counting only the unmasked half of the score matrix; `attended`
    times it for a mask that leaves that share of the S × S scores, e.g. isolated documents)."""
    layers = _field(config, "num_hidden_layers")
    heads = _field(config, "num_attention_heads")
    head_dim = _field(config, "head_dim") or _field(config, "hidden_size") // heads
    attention = 12 * layers * heads * head_dim * seq_len
    share = attended if attended is not None else 0.5 if causal else 1.0
    return 6 * matmul_params(config) + attention * share


def attended_share(document_lengths: list[list[int]], seq_len: int) -> float:
    """The share of the rows' seq_len × seq_len scores that causal attention inside each document
    leaves: a document of l tokens attends l·(l+1)/2 query-key pairs."""
    pairs = sum(length * (length + 1) // 2 for row in document_lengths for length in row)
    return pairs / (len(document_lengths) * seq_len * seq_len)


def _names(gpu_name: str, key: str) -> bool:
    """Whether the device name holds the key as a whole word: "A40" is not in "RTX A4000"."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", gpu_name, re.IGNORECASE) is not None


def peak_flops(gpu_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s for a device name; None on CPU, a MIG slice or an unknown device."""
    if not gpu_name or MIG_MARKER in gpu_name.split():
        return None
    matches = [key for key in PEAK_BF16_FLOPS if _names(gpu_name, key)]
    if not matches:
        return None
    return PEAK_BF16_FLOPS[max(matches, key=len)]


def mfu(tokens_per_s_per_gpu: float, flops_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of the peak, None when the peak is unknown."""
    if peak is None:
        return None
    return tokens_per_s_per_gpu * flops_token / peak
