"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Every rank writes its own shards of the model and optimizer state; rank 0 also
writes `train_state.json` (step and metric history) after DCP has finished, so
a folder holding that file is a complete checkpoint. Loading reshards, so a run
can resume on a different number of workers.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from training.config import TRAIN_STATE_FILE

HF_EXPORT_DIR = "hf"
# Newest complete checkpoints a run keeps, under either launcher; older ones are deleted.
CHECKPOINTS_KEPT = 2


def save_checkpoint(
    path: str, model: nn.Module, optimizer: Optimizer, train_state: dict[str, Any], rank: int
) -> None:
    """Collective: all ranks call it with their own (or a shared) folder."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)
    if rank == 0:
        with open(os.path.join(path, TRAIN_STATE_FILE), "w") as handle:
            json.dump(train_state, handle)


def load_checkpoint(path: str, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Collective: restores model and optimizer in place and returns the saved train state."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=path)
    # dcp.load fills the state dicts in place.
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    with open(os.path.join(path, TRAIN_STATE_FILE)) as handle:
        return json.load(handle)


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, TRAIN_STATE_FILE))


def export_hugging_face(
    path: str, model: nn.Module, causal_lm: Any, prefix: str, tokenizer: Any, rank: int
) -> None:
    """Collective: gathers full weights to rank 0's CPU, which writes a `from_pretrained` folder."""
    full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    weights = {key.removeprefix(prefix): value for key, value in full_state.items()}
    target = os.path.join(path, HF_EXPORT_DIR)
    causal_lm.save_pretrained(target, state_dict=weights)
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(target)
