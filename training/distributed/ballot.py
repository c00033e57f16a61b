"""The step's one host synchronisation: the loss, the gradient norm and a ballot of named counts,
summed over the ranks in one all-reduce, so that every rank reads the same values and takes the
same decisions at the same step.

A component that must decide alike on every rank (the checkpoint writer, the drain watch, the
deadline) registers its slots once (`StepBallot.register`), casts this rank's value into each
before the step's all-reduce (`cast`) and reads the sum over the ranks after it (`counted`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class StepBallot:
    """Named slots summed over the ranks by `step_sync`. Every rank registers the same slots in
    the same order (the same code builds them), so a slot's position is the same everywhere. A
    slot not cast before a step counts 0 for this rank."""

    def __init__(self) -> None:
        self._slots: list[str] = []
        self._cast: dict[str, float] = {}
        self._counted: dict[str, float] = {}

    def register(self, *names: str) -> None:
        taken = [name for name in names if name in self._slots]
        if taken:
            raise ValueError(f"ballot slots {taken} are registered already")
        self._slots.extend(names)

    def cast(self, name: str, value: float) -> None:
        """This rank's value for the step's all-reduce (a vote is 1.0 or 0.0)."""
        if name not in self._slots:
            raise KeyError(f"no ballot slot {name!r}: register it first")
        self._cast[name] = float(value)

    def own(self, name: str) -> float:
        """This rank's value cast for the coming all-reduce (0 where it cast none)."""
        if name not in self._slots:
            raise KeyError(f"no ballot slot {name!r}: register it first")
        return self._cast.get(name, 0.0)

    def counted(self, name: str) -> float:
        """The slot's sum over the ranks from the last `step_sync` (0 before any)."""
        if name not in self._slots:
            raise KeyError(f"no ballot slot {name!r}: register it first")
        return self._counted.get(name, 0.0)

    def values(self) -> list[float]:
        """This rank's casts in slot order; the casts are spent: the next step casts afresh."""
        values = [self._cast.get(name, 0.0) for name in self._slots]
        self._cast = {}
        return values

    def receive(self, sums: list[float]) -> None:
        """The sums over the ranks, in slot order (what `step_sync` read)."""
        self._counted = dict(zip(self._slots, sums, strict=True))


def step_sync(loss: torch.Tensor, grad_norm: torch.Tensor, ballot: StepBallot) -> tuple[float, float]:
    """The global batch's loss (this rank's, averaged over the ranks) and the gradient norm (the
    same on every rank), through one all-reduce and one read: the step's one host
    synchronisation. The ballot's slots ride on the same all-reduce; after it `ballot.counted`
    gives each slot's sum over the ranks, the same on every rank. Summed in float64, so that no
    sum of finite fp32 values overflows into a spurious inf."""
    casts = torch.tensor(ballot.values(), dtype=torch.float64, device=loss.device)
    values = torch.cat([torch.stack([loss.detach().double(), grad_norm.detach().double()]), casts])
    dist.all_reduce(values, op=dist.ReduceOp.SUM)  # gloo has no AVG
    world_size = dist.get_world_size()
    loss_sum, norm_sum, *sums = values.tolist()
    ballot.receive(sums)
    return loss_sum / world_size, norm_sum / world_size
