"""One optimizer step of the tiny model through the loop's `train_step`, on fixed rows split into
micro-batches: what the accumulation tests compare (the loop's in tests/training/test_loop.py, the
spawned ranks' in tests/training/model/test_causal_lm.py)."""

from __future__ import annotations

import pytest
import torch

from tests.harness.build_session import BuildSession
from training.build import build
from training.config.run_config import parse_args
from training.data.packing import NO_LOSS
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX
from training.step import train_step

SEQ_LEN = 32


def two_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of tokens; the first has only 3 valid labels, the second all of them."""
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 256, (2, SEQ_LEN + 1), generator=generator)
    labels = tokens[:, 1:].clone()
    labels[0, 3:] = IGNORE_INDEX
    return tokens[:, :-1], labels


def token_rows() -> torch.Tensor:
    """Eight rows of SEQ_LEN + 1 stored tokens as the loop trains on them (inputs row[:-1], labels
    row[1:]). Rows 0 and 5 end in an ignored label (a token flagged NO_LOSS): a row's last token
    is only ever a label."""
    generator = torch.Generator().manual_seed(11)
    rows = torch.randint(0, 256, (8, SEQ_LEN + 1), generator=generator)
    rows[[0, 5], -1] |= NO_LOSS
    return rows


# Micro-batches of uneven row counts, hence uneven valid-label counts (31 vs 96, and so on):
# a mean of micro-batch means would weigh them equally.
ONE_RANK_MICRO_BATCHES = [[slice(0, 1), slice(1, 4)]]
TWO_RANK_MICRO_BATCHES = [[slice(0, 1), slice(1, 4)], [slice(4, 7), slice(7, 8)]]


def accumulated_step(
    rank: int, world_size: int, micro_batches: list[slice], defer_grad_sync: bool = False
) -> dict:
    """One `train_step` of the tiny model on this rank's micro-batches of `token_rows`: the
    step loss (mean over the ranks), the gradients the optimizer stepped with and the weights
    after the step, all as full tensors."""
    config = parse_args(["--preset", "tiny"])
    model, optimizer, _, _ = build(config, BuildSession(rank, world_size, world_size, torch.device("cpu")))
    rows = token_rows()
    grads: dict[str, torch.Tensor] = {}

    def keep_grads(*_: object) -> None:
        grads.update({name: param.grad.full_tensor() for name, param in model.named_parameters()})

    optimizer.register_step_pre_hook(keep_grads)
    loss, _ = train_step(
        model,
        optimizer,
        [model_batch(rows[part].numpy(), torch.device("cpu")) for part in micro_batches],
        config.lr,
        config.max_grad_norm,
        defer_grad_sync,
        step=1,
    )
    params = {name: param.detach().full_tensor() for name, param in model.named_parameters()}
    return {"loss": loss, "grads": grads, "params": params}


def assert_same_step(got: dict, want: dict) -> None:
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["grads"].keys() == want["grads"].keys() == want["params"].keys()
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
    # AdamW's first update is lr * g / (|g| + eps): where |g| is near eps (1e-8) it magnifies
    # rounding, so the weights agree to a small fraction of the step (lr 3e-3), not to fp32
    # rounding. A second optimizer step, or none, would be off by about lr.
    for name, param in want["params"].items():
        torch.testing.assert_close(got["params"][name], param, rtol=0, atol=1e-4, msg=name)
