"""The optimizer and the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from training.components.optim import build_optimizer, learning_rate, parameter_groups, schedule_settings
from training.config.run_config import (
    parse_args,
)


def test_warmup_is_linear_then_constant():
    config = parse_args(["--lr", "0.01", "--warmup-steps", "4"])
    assert [learning_rate(config, step) for step in (1, 2, 4, 5, 100)] == pytest.approx(
        [0.0025, 0.005, 0.01, 0.01, 0.01]
    )


def tiny_model() -> torch.nn.Module:
    from training.model.causal_lm import build_causal_lm, load_architecture

    config = parse_args(["--preset", "tiny"])
    return build_causal_lm(config, load_architecture(config), torch.device("cpu"))


def test_norm_gains_and_biases_are_not_decayed():
    """As HF Trainer's `get_decay_parameter_names` (and TRL's trainers with it): every RMSNorm's
    gain and the q/k/v biases of Qwen2 go to a group without weight decay; before, AdamW decayed
    all 402,688 parameters of the tiny model, these 1,152 among them."""
    model = tiny_model()
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    decayed, kept = parameter_groups(model, 0.01)
    assert (decayed["weight_decay"], kept["weight_decay"]) == (0.01, 0.0)
    kept_names = sorted(names[id(parameter)] for parameter in kept["params"])
    assert kept_names == sorted(
        name for name in names.values() if name.endswith(("norm.weight", "_layernorm.weight", ".bias"))
    )
    assert {name.rsplit(".", 2)[-2] for name in kept_names} == {
        "input_layernorm", "post_attention_layernorm", "norm", "q_proj", "k_proj", "v_proj",
    }  # fmt: skip
    assert sum(parameter.numel() for parameter in kept["params"]) == 1152
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))


def test_a_step_without_gradient_decays_the_weights_and_leaves_norms_and_biases():
    """AdamW with zero gradients moves a parameter only by its decay, lr x weight_decay x itself."""
    model = tiny_model()
    config = parse_args(["--preset", "tiny", "--weight-decay", "0.1", "--lr", "0.01"])
    optimizer = build_optimizer(model, config, torch.device("cpu"))
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    for name, parameter in model.named_parameters():
        factor = 1.0 if name.endswith((".bias", "norm.weight")) else 1 - 0.01 * 0.1
        torch.testing.assert_close(parameter.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


def test_the_schedule_settings_are_those_the_rate_reads():
    assert schedule_settings(parse_args(["--lr-schedule", "constant", "--steps", "9"])) == {
        "lr_schedule": "constant", "lr": 3e-3, "warmup_steps": 3,
    }  # fmt: skip
    cosine = parse_args(["--lr-schedule", "cosine", "--steps", "9"])
    assert schedule_settings(cosine) == {
        "lr_schedule": "cosine", "lr": 3e-3, "warmup_steps": 3, "steps": 9, "min_lr_ratio": 0.0,
    }  # fmt: skip
    assert schedule_settings(parse_args(["--lr-schedule", "wsd"]))["decay_ratio"] == 0.2
