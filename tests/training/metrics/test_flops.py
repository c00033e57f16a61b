"""Parameter count, FLOPs per token and MFU (PaLM / torchtitan: 6·N + 12·L·H·S), without torch."""

from __future__ import annotations

import pytest
import torch

from training.config.run_config import (
    load_model_config,
)
from training.metrics import flops

QWEN = load_model_config("qwen2.5-1.5b")


def test_qwen_parameter_count_matches_the_published_count():
    assert flops.num_params(QWEN) == 1_543_714_304


def test_qwen_flops_per_token():
    assert round(flops.flops_per_token(QWEN, 2048) / 1e9, 2) == 10.32
    assert round(flops.flops_per_token(QWEN, 4096) / 1e9, 2) == 11.38


@pytest.mark.parametrize("name", ["tiny", "qwen2.5-1.5b"])
def test_parameter_count_matches_the_real_model(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    values = load_model_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values))
    assert flops.num_params(values) == sum(p.numel() for p in model.parameters())


def test_untied_embeddings_count_twice():
    untied = {**QWEN, "tie_word_embeddings": False}
    assert flops.num_params(untied) - flops.num_params(QWEN) == QWEN["vocab_size"] * QWEN["hidden_size"]


def test_untied_input_embedding_does_no_matmul():
    """Untying adds a lookup table, not FLOPs: the lm_head is the one vocab matmul either way."""
    untied = {**QWEN, "tie_word_embeddings": False}
    assert flops.flops_per_token(untied, 4096) == flops.flops_per_token(QWEN, 4096)


def test_attention_term_uses_heads_times_head_dim():
    wide_heads = {**QWEN, "head_dim": 256}  # 12 heads x 256 = 3072, twice hidden_size
    growth = flops.flops_per_token(wide_heads, 4096) - flops.flops_per_token(wide_heads, 2048)
    assert growth == 12 * QWEN["num_hidden_layers"] * 12 * 256 * 2048


def test_causal_figure_halves_the_attention_term():
    full, causal = flops.flops_per_token(QWEN, 4096), flops.flops_per_token(QWEN, 4096, causal=True)
    assert full - causal == 6 * QWEN["num_hidden_layers"] * QWEN["hidden_size"] * 4096


def test_isolated_documents_count_the_attention_their_mask_leaves():
    """Eight documents of 512 tokens in a row of 4096 attend 8 x 512·513/2 query-key pairs, 6.26% of
    the 4096² scores; one document of the whole row is the causal figure, plus its diagonal."""
    share = flops.attended_share([[512] * 8], 4096)
    assert share == 8 * 512 * 513 / 2 / 4096**2
    assert flops.attended_share([[4096]], 4096) == 4097 / 2 / 4096
    full = flops.flops_per_token(QWEN, 4096)
    attention = 12 * QWEN["num_hidden_layers"] * QWEN["hidden_size"] * 4096
    assert flops.flops_per_token(QWEN, 4096, attended=share) == pytest.approx(full - attention * (1 - share))
    assert flops.flops_per_token(QWEN, 4096, attended=0.5) == flops.flops_per_token(QWEN, 4096, causal=True)


@pytest.mark.parametrize(
    "device_name, tflops",
    [
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H200", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A10G", 70),
        ("NVIDIA A10", 125),
        ("NVIDIA H800 PCIe", 756),
        ("NVIDIA H800", 989),
        ("NVIDIA A40", 149.7),
        ("NVIDIA RTX 6000 Ada Generation", 364.2),
    ],
)
def test_peak_flops_per_gpu(device_name, tflops):
    assert flops.peak_flops(device_name) == tflops * 1e12


@pytest.mark.parametrize(
    "device_name",
    [
        None,
        "",
        "cpu",
        "Some Unknown Accelerator",
        "NVIDIA RTX A4000",  # not an A40
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a seventh of an A100: its peak is not the GPU's
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    ],
)
def test_peak_flops_unknown_is_none(device_name):
    assert flops.peak_flops(device_name) is None


def test_mfu_is_model_flops_over_peak():
    per_token = flops.flops_per_token(QWEN, 2048)
    assert flops.mfu(10_000, per_token, 989e12) == pytest.approx(10_000 * 10.31925e9 / 989e12, rel=1e-5)
    assert flops.mfu(10_000, per_token, None) is None
