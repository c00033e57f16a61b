"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and Hugging Face exports of them.

Every rank writes its own shards of the model and optimizer state straight to the checkpoint's
location, a local folder or an object store URI (`training.components.storage`); rank 0 also
writes `train_state.json` (step, metric history, what the data replay depends on and
the architecture) after DCP has finished and every shard is there at its size, so a folder holding
that file is a complete checkpoint. Loading reshards, so a run can resume on a different number of
workers, each rank reading its own shards; the loop replays the data by global sample index
(training/loop.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from training.components import storage
from training.config.run_config import TRAIN_STATE_FILE
from training.data.documents import end_of_turn
from training.data.tokenizer import HuggingFaceTokenizer, Tokenizer
from training.model.causal_lm import TIED_LM_HEAD

HF_EXPORT_DIR = "hf"
HF_WEIGHTS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
# What checkpoints are ranked by when the run evaluates (--eval-data), lower being better: the key
# of the step metrics Ray Train scores them on, and of the train state a torchrun run reads it from.
CHECKPOINT_SCORE = "eval_loss"
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def write_error(error: BaseException) -> str:
    """A failed write in one line: DCP's `CheckpointException` (a `BaseException`, raised alike on every
    rank) carries each failed rank's own error and traceback; the first rank's error is the cause."""
    if isinstance(error, CheckpointException) and error.failures:
        rank, (cause, _) = next(iter(sorted(error.failures.items())))
        return f"rank {rank}: " + " ".join(str(cause).split())[:300]
    return " ".join(str(error).split())[:300] or type(error).__name__


class CheckpointWriteError(RuntimeError):
    """A synchronous checkpoint that could not be written whole (an upload refused or cut)."""


def save_checkpoint(
    path: str, model: nn.Module, optimizer: Optimizer, train_state: dict[str, Any], rank: int
) -> None:
    """Collective: all ranks call it with the same location (a folder every rank reaches, or a URI)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state}, storage_writer=storage.storage_writer(path)
    )
    if rank == 0:
        write_train_state(path, train_state)


def write_train_state(path: str, train_state: dict[str, Any]) -> None:
    """Rank 0's last write to a checkpoint folder, once every rank's shards are written: its
    presence makes the folder complete (`is_complete`)."""
    storage.write_json(storage.join(path, TRAIN_STATE_FILE), train_state)


def read_train_state(path: str) -> dict[str, Any]:
    state: dict[str, Any] = storage.read_json(storage.join(path, TRAIN_STATE_FILE))
    return state


def load_checkpoint(path: str, model: nn.Module, optimizer: Optimizer) -> None:
    """Collective: restores model and optimizer in place, resharded onto this run's ranks; each rank
    reads the byte ranges of its own shards from the checkpoint's location."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.load(
        {"model": model_state, "optimizer": optimizer_state}, storage_reader=storage.storage_reader(path)
    )
    # dcp.load fills the state dicts in place.
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)


def load_weights(path: str, model: nn.Module) -> None:
    """Collective: the checkpoint's model weights alone, resharded; the optimizer state is not read."""
    model_state = get_model_state_dict(model)
    dcp.load({"model": model_state}, storage_reader=storage.storage_reader(path))
    set_model_state_dict(model, model_state)


def is_complete(path: str) -> bool:
    return storage.exists(storage.join(path, TRAIN_STATE_FILE))


# The prefix of a checkpoint folder's name in a run's folder: `checkpoint_<step, 6 digits>`.
CHECKPOINT_PREFIX = "checkpoint_"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:06d}"


def not_whole(path: str) -> list[str]:
    """Why the checkpoint at `path` cannot be resumed from ([]: it can): no train state (its commit
    never happened), or a shard its metadata names missing or short (`storage.missing_files`)."""
    if not is_complete(path):
        return [f"no {TRAIN_STATE_FILE}"]
    return storage.missing_files(path)


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a restart resumes from (None: none), and the line that says why it is not the
    one the launcher named (None: it is)."""

    location: str | None
    line: str | None = None


def resume_point(latest: str | None, run_location: str) -> ResumePoint:
    """`latest` (the launcher's newest committed checkpoint) if it is whole, else the newest whole
    checkpoint folder of `run_location` before it, said in one line."""
    if latest is None:
        return ResumePoint(None)
    problems = not_whole(latest)
    if not problems:
        return ResumePoint(latest)
    name = os.path.basename(latest.rstrip("/"))
    older = [
        storage.join(run_location, folder)
        for folder in reversed(storage.folders(run_location, CHECKPOINT_PREFIX))
        if folder < name
    ]
    fallback = next((folder for folder in older if not not_whole(folder)), None)
    why = "; ".join(problems)
    if fallback is None:
        return ResumePoint(
            None, f"checkpoint {latest} is not whole ({why}) and no earlier one is: starting from step 0"
        )
    return ResumePoint(
        fallback, f"checkpoint {latest} is not whole ({why}): resuming from the newest whole one, {fallback}"
    )


def remove_abandoned(run_location: str, keep: str | None) -> list[str]:
    """Remove the checkpoint folders of `run_location` whose commit never happened (no train state:
    a write a killed or stopped attempt left), except `keep`; the names removed."""
    removed = []
    for folder in storage.folders(run_location, CHECKPOINT_PREFIX):
        location = storage.join(run_location, folder)
        if location != keep and not is_complete(location):
            storage.remove(location)
            removed.append(folder)
    return removed


def checkpoints_kept(scores: Sequence[float | None], keep: int) -> set[int]:
    """Which of a run's checkpoints, in the order written, it keeps (--keep-checkpoints `keep`):
    the `keep` of lowest score (eval_loss), or, none scored, the `keep` latest; and the latest
    always, which a resume starts from. A missing or NaN score ranks last; of equal scores the
    later is kept. Ray Train keeps the same ones with `CheckpointConfig(num_to_keep=keep,
    checkpoint_score_attribute=CHECKPOINT_SCORE, checkpoint_score_order="min")` (ray 2.58:
    train/v2/_internal/execution/checkpoint/checkpoint_manager.py, which never deletes the latest);
    the torchrun launcher applies this rule itself."""
    if all(score is None for score in scores):
        ranked = list(range(len(scores)))
    else:

        def worth(index: int) -> tuple[bool, float, int]:
            score = scores[index]
            if score is None or math.isnan(score):
                return False, 0.0, index
            return True, -score, index

        ranked = sorted(range(len(scores)), key=worth)
    return set(ranked[-keep:]) | ({len(scores) - 1} if scores else set())


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


def legacy_config_keys(values: dict[str, Any]) -> dict[str, Any]:
    """A config.json as transformers 5 writes it, with the top-level keys transformers 4 reads in
    their place beside its own: `rope_theta` (transformers 5 keeps it inside `rope_parameters`;
    transformers 4's Qwen2Config reads the top-level key and, without it, takes 10000 where
    Qwen2.5 has 1,000,000, silently), `rope_scaling` for a RoPE type other than the default, and
    `torch_dtype` (transformers 5 writes `dtype`). Keys already there are left as they are."""
    legacy: dict[str, Any] = {}
    rope = values.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        legacy["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            legacy["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    if "dtype" in values:
        legacy["torch_dtype"] = values["dtype"]
    return {**legacy, **values}


def generation_settings(architecture: Any, tokenizer: Tokenizer) -> dict[str, Any]:
    """The export's generation_config.json: generation stops at the chat template's end of turn as
    well as at the tokenizer's EOS and the model's (Qwen2.5-Instruct's has `eos_token_id`
    [151645, 151643], `<|im_end|>` and `<|endoftext|>`), and pads with the tokenizer's EOS. Without
    it `generate()` stops only at the base model's `eos_token_id`, which a chat fine-tune learns not
    to emit after its turn. A template whose end of turn is several tokens (the byte tokenizer's
    `<|end|>`) adds none: `eos_token_id` stops at any one of its tokens."""
    turn = end_of_turn(tokenizer)
    model_eos = getattr(architecture, "eos_token_id", None)
    model_stops = model_eos if isinstance(model_eos, list) else [] if model_eos is None else [model_eos]
    stops = [*(turn if len(turn) == 1 else []), tokenizer.eos_id, *model_stops]
    settings = {"eos_token_id": list(dict.fromkeys(stops)), "pad_token_id": tokenizer.eos_id}
    bos = getattr(architecture, "bos_token_id", None)
    return settings if bos is None else {"bos_token_id": bos, **settings}


def write_hugging_face(
    target: str, weights: dict[str, torch.Tensor], architecture: Any, dtype: str, tokenizer: Tokenizer
) -> None:
    """A `from_pretrained` folder: one safetensors file, the config (which names the dtype, in
    transformers 5's keys and 4's), the generation config, and a Hugging Face tokenizer's files."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    os.makedirs(target, exist_ok=True)
    save_file(weights, os.path.join(target, HF_WEIGHTS_FILE), metadata={"format": "pt"})
    config = copy.deepcopy(architecture)
    config.dtype = EXPORT_DTYPES[dtype]
    config.save_pretrained(target)
    config_path = os.path.join(target, HF_CONFIG_FILE)
    with open(config_path) as handle:
        values = json.load(handle)
    with open(config_path, "w") as handle:
        json.dump(legacy_config_keys(values), handle, indent=2, sort_keys=True)
        handle.write("\n")
    GenerationConfig(**generation_settings(architecture, tokenizer)).save_pretrained(target)
    if isinstance(tokenizer, HuggingFaceTokenizer):
        tokenizer.save_pretrained(target)


def export_hugging_face(
    path: str, model: nn.Module, architecture: Any, prefix: str, dtype: str, tokenizer: Tokenizer, rank: int
) -> None:
    """Collective: gathers full weights to rank 0's CPU, which writes `path`/hf."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    if rank != 0:
        return
    tied = bool(getattr(architecture, "tie_word_embeddings", False))
    weights = hugging_face_weights(full_state, prefix, tied=tied, dtype=dtype)
    if not storage.is_uri(path):
        write_hugging_face(os.path.join(path, HF_EXPORT_DIR), weights, architecture, dtype, tokenizer)
        return
    # The Hugging Face writers write local files: staged on this node, then uploaded beside the shards.
    with tempfile.TemporaryDirectory(prefix="hf-export-") as local:
        write_hugging_face(local, weights, architecture, dtype, tokenizer)
        storage.upload_folder(local, storage.join(path, HF_EXPORT_DIR))
