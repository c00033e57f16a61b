"""The loss is the mean over the global batch's valid labels, on any number of ranks.

Two gloo ranks on CPU whose batches hold very different numbers of valid labels must
produce the loss and the gradients of one process training on both batches at once.
FSDP2 averages gradients over the ranks (torch.distributed.fsdp: the reduce-scatter
divides by the data-parallel size), which is what the normaliser must compensate.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy

import training.parallelize
from training.config import parse_args
from training.loss import IGNORE_INDEX
from training.model import CausalLMWithFusedLoss, build_causal_lm, load_architecture
from training.parallelize import build_mesh, parallelize

SEQ_LEN = 32


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of tokens; the first has only 3 valid labels, the second all of them."""
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 256, (2, SEQ_LEN + 1), generator=generator)
    labels = tokens[:, 1:].clone()
    labels[0, 3:] = IGNORE_INDEX
    return tokens[:, :-1], labels


def _train_step(rank: int, world_size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    # fp32 throughout, so the comparison is exact to rounding and tests the normalisation alone.
    training.parallelize.MIXED_PRECISION = MixedPrecisionPolicy()
    config = parse_args(["--preset", "tiny"])
    architecture = load_architecture(config)
    model = CausalLMWithFusedLoss(build_causal_lm(config, architecture, torch.device("cpu")), 8)
    parallelize(
        model,
        build_mesh("cpu", world_size, 1),
        compile_layers=False,
        activation_checkpointing=False,
        reshard_after_forward=True,
    )
    inputs, labels = _rows()
    if world_size > 1:
        inputs, labels = inputs[rank : rank + 1], labels[rank : rank + 1]
    loss = model(inputs, labels)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {name: param.grad.full_tensor() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save({"loss": total.item() / world_size, "grads": grads}, out)
    dist.destroy_process_group()


def _run(world_size: int, tmp_path) -> dict:
    out = str(tmp_path / f"world{world_size}.pt")
    mp.spawn(_train_step, args=(world_size, str(tmp_path / f"pg{world_size}"), out), nprocs=world_size)
    return torch.load(out)


@pytest.mark.slow
def test_two_ranks_with_uneven_valid_labels_match_one_process(tmp_path):
    single, split = _run(1, tmp_path), _run(2, tmp_path)
    assert split["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert single["grads"].keys() == split["grads"].keys()
    for name, want in single["grads"].items():
        torch.testing.assert_close(split["grads"][name], want, rtol=1e-4, atol=1e-7, msg=name)
