"""Resume compatibility: what a checkpoint holds (`CheckpointContents`: the shards, the train state
with its checkpoint settings), and the one-line refusals of a resume or an --init-from that cannot
continue as the uninterrupted run would."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer

from training.components.checkpoint import CHECKPOINT_SCORE, export_hugging_face, save_checkpoint
from training.components.optim import schedule_settings
from training.config.run_config import TrainConfig, flag_name, nothing_left_to_train
from training.data.batches import position_after
from training.data.tokenizer import load_tokenizer
from training.errors import UsageError
from training.model.causal_lm import CAUSAL_LM_PREFIX

# What the replayed data depends on, saved with each checkpoint (with the global batch and the
# schedule's settings, below); a resume must keep each.
REPLAY_KEYS = ("seq_len", "seed", "corpus", "batch_size")
WEIGHTS_ALONE = "or take its weights alone with --init-from"


def checkpoint_settings(config: TrainConfig, world_size: int, corpus: str) -> dict[str, Any]:
    """What a checkpoint records for a resume to train as the uninterrupted run would: the data
    replay's inputs (`corpus`: the packed rows' `corpus_fingerprint`, or 'synthetic'), the global
    batch in sequences (world size x --batch-size x --grad-accum-steps) and the settings the
    learning rate of each step depends on (`schedule_settings`)."""
    return {
        "world_size": world_size,
        "grad_accum_steps": config.grad_accum_steps,
        "global_batch": world_size * config.batch_size * config.grad_accum_steps,
        "corpus": corpus,
        **{key: getattr(config, key) for key in REPLAY_KEYS if key != "corpus"},
        "schedule": schedule_settings(config),
    }


def recorded_global_batch(state: dict[str, Any]) -> int | None:
    """A checkpoint's global batch; for a checkpoint without the key, one written without
    accumulation, its world size times its batch size (one micro-batch)."""
    if "global_batch" in state:
        return int(state["global_batch"])
    if "world_size" in state and "batch_size" in state:
        return int(state["world_size"] * state["batch_size"] * state.get("grad_accum_steps", 1))
    return None


def _global_batch_problem(state: dict[str, Any], settings: dict[str, Any], checkpoint: str) -> str | None:
    saved = recorded_global_batch(state)
    if saved is None or saved == settings["global_batch"]:
        return None
    per_micro = settings["world_size"] * settings["batch_size"]
    fix = (
        f"pass --grad-accum-steps {saved // per_micro}"
        if saved % per_micro == 0
        else f"run workers x --grad-accum-steps = {saved // settings['batch_size']}"
    )
    was = f"world size {state.get('world_size')} x --batch-size {state.get('batch_size')} x --grad-accum-steps {state.get('grad_accum_steps', 1)}"
    now = f"{settings['world_size']} x {settings['batch_size']} x {settings['grad_accum_steps']}"
    return (
        f"{checkpoint} was written with a global batch of {saved} sequences ({was}); this run's is "
        f"{settings['global_batch']} ({now}): {fix} to keep it, {WEIGHTS_ALONE}"
    )


def check_resume(state: dict[str, Any], settings: dict[str, Any], steps: int, checkpoint: str) -> None:
    """Raises a one-line `UsageError` when the run cannot continue from `state`: it is at or past
    --steps, a value the data replay depends on differs, the global batch differs (any split of it
    into workers and micro-batches resumes: a step's rows are the same, `epoch_batches`), or a
    setting of the learning-rate schedule does. Checkpoints older than a key did not record it;
    the oldest had no accumulation (1)."""
    if problem := nothing_left_to_train(state["step"], steps, checkpoint):
        raise UsageError(problem)
    for key in REPLAY_KEYS:
        saved = state.get(key)
        if saved is None or saved == settings[key]:
            continue
        if key == "corpus":
            raise UsageError(
                f"{checkpoint} was trained on other rows (--data or --tokenizer differ from its run's): "
                f"resume with its corpus, {WEIGHTS_ALONE}"
            )
        raise UsageError(
            f"{checkpoint} was written with {flag_name(key)} {saved}: resume with the same, {WEIGHTS_ALONE}"
        )
    if problem := _global_batch_problem(state, settings, checkpoint):
        raise UsageError(problem)
    saved_schedule = state.get("schedule", {})
    for key, saved in saved_schedule.items():  # --lr-schedule first: it decides the other keys
        if settings["schedule"].get(key) == saved:
            continue
        why = (
            f" (its --lr-schedule {saved_schedule['lr_schedule']} decays towards the last step)"
            if key == "steps"
            else ""
        )
        raise UsageError(
            f"{checkpoint} was written with {flag_name(key)} {saved}{why}: resume with the same, so the "
            f"learning rate of every step is the uninterrupted run's, {WEIGHTS_ALONE}"
        )


def check_same_architecture(state: dict[str, Any], architecture: Any, checkpoint: str) -> None:
    """--init-from loads weights into the architecture the flags build; a one-line error if they differ."""
    saved = state.get("architecture")
    if saved is None:
        return
    built = architecture.to_dict()
    differ = [key for key in ARCHITECTURE_KEYS if key in saved and saved[key] != built.get(key)]
    if differ:
        shown = ", ".join(f"{key} {saved[key]} (the flags build {built.get(key)})" for key in differ)
        raise UsageError(
            f"--init-from {checkpoint} holds a model of {shown}: pass the --model-config or --model-id "
            "it was trained with"
        )


# What makes two architectures' weights incompatible.
ARCHITECTURE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)


@dataclass
class CheckpointContents:
    """What a checkpoint of this run holds: the model and optimizer shards and rank 0's train state
    (the step, the metric history so far, the `checkpoint_settings`, the data position a resume
    continues from, the architecture and the tokenizer); with --export-hf, the run's last one also
    holds the Hugging Face export."""

    model: nn.Module
    optimizer: Optimizer
    architecture: Any
    settings: dict[str, Any]
    history: list[dict[str, Any]]  # the run's, as it grows: a state copies it when made
    start_step: int
    position: tuple[int, int]  # the data position at `start_step`
    rows: int | None  # the corpus's rows; None for synthetic tokens, which have no position
    tokenizer: str
    export_dtype: str | None  # --export-hf's dtype; None without an export
    rank: int

    def train_state(self, step: int, eval_loss: float | None) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": step,
            "history": list(self.history),
            **self.settings,
            CHECKPOINT_SCORE: eval_loss,
        }
        if self.rows is not None:
            state["data_position"] = position_after(
                self.position,
                step - self.start_step,
                rows=self.rows,
                global_batch=self.settings["global_batch"],
            )
        state["architecture"] = json.loads(self.architecture.to_json_string(use_diff=False))
        state["tokenizer"] = self.tokenizer
        return state

    def saver(self, step: int, eval_loss: float | None, last: bool) -> Callable[[str], None]:
        """Writes the checkpoint of `step` synchronously to a path (collective); the run's `last`
        exports it too with --export-hf."""

        def write(path: str) -> None:
            save_checkpoint(path, self.model, self.optimizer, self.train_state(step, eval_loss), self.rank)
            if self.export_dtype is not None and last:
                export_hugging_face(
                    path,
                    self.model,
                    self.architecture,
                    CAUSAL_LM_PREFIX,
                    self.export_dtype,
                    load_tokenizer(self.tokenizer),
                    self.rank,
                )

        return write
