"""What `training.build.build` reads of a launcher's session, for tests that build the model
outside any launcher (spawned gloo ranks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BuildSession:
    rank: int
    world_size: int
    local_world_size: int
    device: torch.device
