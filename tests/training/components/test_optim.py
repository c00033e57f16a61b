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


def _sharded_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two copies of the tiny model under FSDP2 (one rank: every parameter a Shard(0) DTensor)."""
    from torch.distributed.fsdp import fully_shard

    models = []
    for _ in range(2):
        model = tiny_model()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        models.append(model)
    return models[0], models[1]


def _dtensor_ops(run) -> list[str]:
    """The ATen ops `run` calls with a DTensor among their arguments."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(isinstance(leaf, DTensor) for leaf in tree_leaves((args, kwargs or {}))):
                seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Watch():
        run()
    return seen


def test_the_shard_local_step_is_torchs_adamw_bit_for_bit_with_no_dtensor_dispatch(one_rank_group):
    """Three steps of the job's optimizer and of torch's AdamW on the same sharded model and
    gradients: the same parameters and state bit for bit, the same state dict; torch's AdamW hands
    DTensors to its kernels (each dispatched on the host), the job's hands none after the state
    exists."""
    from torch.distributed.tensor import distribute_tensor

    config = parse_args(["--preset", "tiny", "--weight-decay", "0.1", "--lr", "0.01"])
    ours, reference = _sharded_pair()
    optimizer = build_optimizer(ours, config, torch.device("cpu"))
    stock = torch.optim.AdamW(parameter_groups(reference, config.weight_decay), lr=config.lr, foreach=True)
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
            grad = torch.randn(a.shape, generator=generator)
            # A DTensor gradient sharded as its parameter, as FSDP2 leaves it.
            a.grad = distribute_tensor(grad, a.device_mesh, a.placements)
            b.grad = distribute_tensor(grad, b.device_mesh, b.placements)
        ours_ops = _dtensor_ops(optimizer.step)
        stock_ops = _dtensor_ops(stock.step)
        # The first step creates the state as DTensors (AdamW's own `_init_group`); no kernel sees one.
        assert ours_ops == (["aten.zeros_like.default"] * len(ours_ops) if step == 0 else []), ours_ops[:3]
        assert stock_ops, "torch's AdamW no longer dispatches DTensors: the shard-local step is moot"
    for a, b in zip(ours.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a.full_tensor(), b.full_tensor())
    ours_state, stock_state = optimizer.state_dict(), stock.state_dict()
    assert ours_state["param_groups"] == stock_state["param_groups"]
    for index, state in stock_state["state"].items():
        assert ours_state["state"][index].keys() == state.keys()
        for key, value in state.items():
            mine = ours_state["state"][index][key]
            assert type(mine) is type(value), key
            assert torch.equal(
                mine.full_tensor() if hasattr(mine, "full_tensor") else mine,
                value.full_tensor() if hasattr(value, "full_tensor") else value,
            ), key
