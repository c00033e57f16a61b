"""The step's ballot and its one all-reduce (training/distributed/ballot.py): named slots summed
over the ranks in float64 with the loss and the gradient norm, the same sums on every rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.distributed.ballot import StepBallot, step_sync


def test_a_slot_is_registered_once_and_read_by_name():
    ballot = StepBallot()
    ballot.register("written", "due")
    with pytest.raises(ValueError, match="registered already"):
        ballot.register("due")
    with pytest.raises(KeyError, match="register it first"):
        ballot.cast("unknown", 1.0)
    with pytest.raises(KeyError, match="register it first"):
        ballot.counted("unknown")
    assert ballot.counted("due") == 0.0  # before any all-reduce


def test_the_casts_are_spent_by_the_step_that_sends_them(one_rank_group):
    ballot = StepBallot()
    ballot.register("written", "due")
    ballot.cast("due", 1.0)
    assert ballot.own("due") == 1.0 and ballot.own("written") == 0.0
    assert step_sync(torch.tensor(1.5), torch.tensor(0.5), ballot) == (1.5, 0.5)
    assert (ballot.counted("written"), ballot.counted("due")) == (0.0, 1.0)
    step_sync(torch.tensor(1.5), torch.tensor(0.5), ballot)  # no cast this step: each counts 0
    assert (ballot.counted("written"), ballot.counted("due")) == (0.0, 0.0)


def test_sums_of_large_fp32_values_do_not_overflow(one_rank_group):
    big = torch.tensor(3e38, dtype=torch.float32)
    ballot = StepBallot()
    loss, norm = step_sync(big, big, ballot)
    assert loss == pytest.approx(3e38) and norm == pytest.approx(3e38)


def _ranks(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ballot = StepBallot()
    ballot.register("written", "stop")
    ballot.cast("written", 1.0)
    ballot.cast("stop", 1.0 if rank == 1 else 0.0)
    loss, norm = step_sync(torch.tensor(float(rank + 1)), torch.tensor(2.0), ballot)
    result = {
        "loss": loss,
        "norm": norm,
        "written": ballot.counted("written"),
        "stop": ballot.counted("stop"),
    }
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_two_ranks_read_the_same_sums(tmp_path):
    mp.spawn(_ranks, args=(str(tmp_path / "pg"), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0] == ranks[1] == {"loss": 1.5, "norm": 2.0, "written": 2.0, "stop": 1.0}
