"""Sharding choices: HSDP replica groups and float8 linears."""

from __future__ import annotations

import pytest
import torch

from training.config.run_config import (
    PRESETS,
)
from training.distributed.parallelize import replica_groups


def test_hsdp_replica_groups():
    assert replica_groups(8, 4, 0) == 2  # auto: one replica group per node
    assert replica_groups(8, 8, 0) == 1
    assert replica_groups(8, 4, 1) == 1
    with pytest.raises(ValueError):
        replica_groups(6, 6, 4)


def _tiny_lm():
    from training.config.run_config import TrainConfig
    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture

    config = TrainConfig(
        **{**PRESETS["tiny"], "preset": "tiny", "storage_path": "unused", "run_name": "t", "local": False}
    )
    return CausalLMWithFusedLoss(build_causal_lm(config, load_architecture(config), torch.device("cpu")), 64)


def test_float8_swaps_the_decoders_linears_and_keeps_the_lm_head(monkeypatch):
    """torchao converts modules wherever they live; the capability check is what needs the GPU,
    so it is answered here as an L4 (compute capability 8.9) would answer it."""
    from torchao.float8.float8_linear import Float8Linear

    from training.distributed.parallelize import convert_to_float8

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    model = _tiny_lm()
    convert_to_float8(model, torch.device("cuda", 0))
    decoder_linears = [m for m in model.causal_lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert decoder_linears and all(isinstance(m, Float8Linear) for m in decoder_linears)
    assert type(model.causal_lm.lm_head) is torch.nn.Linear


@pytest.mark.parametrize(
    ("device", "capability", "name", "shown"),
    [("cpu", None, None, "a CPU"), ("cuda", (8, 6), "NVIDIA A10G", "NVIDIA A10G")],
)
def test_float8_on_hardware_without_fp8_tensor_cores_is_one_line(
    monkeypatch, device, capability, name, shown
):
    from training.distributed.parallelize import convert_to_float8
    from training.errors import UsageError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    with pytest.raises(
        UsageError, match=f"--float8 needs FP8 tensor cores .*this is {shown}: pass --no-float8"
    ):
        convert_to_float8(_tiny_lm(), torch.device(device, 0) if device == "cuda" else torch.device("cpu"))
