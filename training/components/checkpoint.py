"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and Hugging Face exports of them.

Every rank writes its own shards of the model and optimizer state; rank 0 also
writes `train_state.json` (step, metric history, what the data replay depends on and
the architecture) after DCP has finished, so a folder holding that file is a complete
checkpoint. Loading reshards, so a run can resume on a different number of workers;
the loop replays the data by global sample index (training/loop.py).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from training.config.run_config import TRAIN_STATE_FILE
from training.model.causal_lm import TIED_LM_HEAD

HF_EXPORT_DIR = "hf"
HF_WEIGHTS_FILE = "model.safetensors"
# Newest complete checkpoints a run keeps, under either launcher; older ones are deleted.
CHECKPOINTS_KEPT = 2
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def save_checkpoint(
    path: str, model: nn.Module, optimizer: Optimizer, train_state: dict[str, Any], rank: int
) -> None:
    """Collective: all ranks call it with their own (or a shared) folder."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)
    if rank == 0:
        with open(os.path.join(path, TRAIN_STATE_FILE), "w") as handle:
            json.dump(train_state, handle)


def read_train_state(path: str) -> dict[str, Any]:
    with open(os.path.join(path, TRAIN_STATE_FILE)) as handle:
        state: dict[str, Any] = json.load(handle)
        return state


def load_checkpoint(path: str, model: nn.Module, optimizer: Optimizer) -> None:
    """Collective: restores model and optimizer in place, resharded onto this run's ranks."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)
    # dcp.load fills the state dicts in place.
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)


def load_weights(path: str, model: nn.Module) -> None:
    """Collective: the checkpoint's model weights alone, resharded; the optimizer state is not read."""
    model_state = get_model_state_dict(model)
    dcp.load({"model": model_state}, checkpoint_id=path)
    set_model_state_dict(model, model_state)


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, TRAIN_STATE_FILE))


def hugging_face_weights(
    state: dict[str, torch.Tensor], prefix: str, *, tied: bool, dtype: str
) -> dict[str, torch.Tensor]:
    """The causal LM's weights under their Hugging Face names, in `dtype`. A tied model keeps its
    embedding once: a full state dict holds the lm_head as a second copy, which `save_pretrained`
    (it drops ties by shared storage) would store again."""
    weights = {key.removeprefix(prefix): value for key, value in state.items()}
    if tied:
        weights.pop(TIED_LM_HEAD, None)
    return {key: value.to(EXPORT_DTYPES[dtype]).contiguous() for key, value in weights.items()}


def write_hugging_face(target: str, weights: dict[str, torch.Tensor], architecture: Any, dtype: str) -> None:
    """A `from_pretrained` folder: one safetensors file and the config, which names the dtype."""
    from safetensors.torch import save_file

    os.makedirs(target, exist_ok=True)
    save_file(weights, os.path.join(target, HF_WEIGHTS_FILE), metadata={"format": "pt"})
    config = copy.deepcopy(architecture)
    config.dtype = EXPORT_DTYPES[dtype]
    config.save_pretrained(target)


def export_hugging_face(
    path: str, model: nn.Module, architecture: Any, prefix: str, dtype: str, tokenizer: Any, rank: int
) -> None:
    """Collective: gathers full weights to rank 0's CPU, which writes `path`/hf."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    if rank != 0:
        return
    tied = bool(getattr(architecture, "tie_word_embeddings", False))
    target = os.path.join(path, HF_EXPORT_DIR)
    write_hugging_face(
        target, hugging_face_weights(full_state, prefix, tied=tied, dtype=dtype), architecture, dtype
    )
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(target)
