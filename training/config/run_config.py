"""Run configuration: the parser derived from the settings, and the validation of a run's values
(no torch, no ray).

Each setting is declared once, in `training.config.settings` (its flag, value parser and help); the
presets in `training.config.presets` fill every field; flags given on the command line override them.
Bad values are reported through argparse, so the CLI exits 2 with its usage text instead of
failing later inside a Ray worker.

This parser is the one judge of every training setting. The Pulumi program validates the stack's
`training:` block with it at preview (`infra.config.training_settings`): each camelCase key is the flag
of the same name (`seqLen: 256` is `--seq-len 256`), so a setting added to `TrainConfig` is a
stack key with no other edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from training.config.corpus_files import CORPUS_SUFFIXES as CORPUS_SUFFIXES
from training.config.corpus_files import SHIPPED_CORPUS, SYNTHETIC, corpus_files
from training.config.model_configs import CONFIG_DIR as CONFIG_DIR
from training.config.model_configs import is_shipped, load_model_config
from training.config.presets import BYTE_TOKENIZER, DEFAULT_PRESET, PRESETS
from training.config.settings import DEFAULT_STORAGE_PATH, TrainConfig, flag_of

PACKAGE_DIR = Path(__file__).resolve().parents[1]
TRAIN_STATE_FILE = "train_state.json"
_FIELDS = {field.name: field for field in dataclasses.fields(TrainConfig)}


def flag_name(key: str) -> str:
    """The flag of a `TrainConfig` field, as a message names it (`seq_len`: --seq-len)."""
    return flag_of(_FIELDS[key]).names[0]


def _shown(key: str, value: Any) -> str:
    """A setting's value as --help shows it."""
    if value is None:
        return flag_of(_FIELDS[key]).unset
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "hsdp_replicas" and value == 0:
        return "auto"
    if key == "model_id" and is_shipped(value):
        return f"{value}, a shipped architecture with random weights, not a Hub id"
    if key == "data" and value == str(SHIPPED_CORPUS):
        return str(SHIPPED_CORPUS.relative_to(PACKAGE_DIR.parent))
    return str(value)


def preset_default(key: str) -> str:
    """The default of a setting for --help: the default preset's value, then the other
    presets' where they differ, e.g. '(default: 128; --preset throughput: 4096)'."""
    values = {name: preset.get(key) for name, preset in PRESETS.items()}
    default = values[DEFAULT_PRESET]
    others = [
        f"--preset {name}: {_shown(key, value)}"
        for name, value in sorted(values.items())
        if name != DEFAULT_PRESET and value != default
    ]
    return "(default: " + "; ".join([_shown(key, default), *others]) + ")"


class ArgumentsError(ValueError):
    """A flag or its value is wrong; the message is argparse's, e.g. 'argument --steps: must be >= 1'."""

    @property
    def reason(self) -> str:
        """The message without argparse's 'argument --flag: ' prefix."""
        return re.sub(r"^argument [^ ]+: ", "", str(self))


class _Parser(argparse.ArgumentParser):
    """Raises `ArgumentsError` instead of printing usage and exiting, so the Pulumi program can
    check a job's flags at preview; `parse_args` turns it back into argparse's exit 2."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(message)


def build_parser() -> argparse.ArgumentParser:
    """The flags of every `TrainConfig` field, in its order; a field's --help ends with its
    default from the presets."""
    parser = _Parser(
        prog="python -m training",
        description=(
            "Train Qwen2.5 with FSDP2 in bf16 on Ray Train (or torchrun). A preset sets every "
            f"value; flags override it. Defaults below are --preset {DEFAULT_PRESET}'s, followed "
            "by the other presets' where they differ."
        ),
    )
    for name, field in _FIELDS.items():
        flag = flag_of(field)
        text = flag.help
        if name in PRESETS[DEFAULT_PRESET]:
            text = f"{text} {preset_default(name)}".replace("%", "%%")
        parser.add_argument(*flag.names, dest=name, help=text, **flag.options)
    return parser


def is_uri(path: str) -> bool:
    """s3://, gs:// and the like, as opposed to a local path."""
    return "://" in path


def check_hsdp_replicas(workers: int, replicas: int) -> None:
    """HSDP shards inside each replica group, so the workers must split evenly into the groups."""
    if replicas and workers % replicas:
        raise ValueError(f"{workers} workers are not a multiple of --hsdp-replicas {replicas}")


def nothing_left_to_train(step: int, steps: int, checkpoint: str) -> str | None:
    """Why a run resumed from `checkpoint` (at `step`) to --steps `steps` would train nothing."""
    if step < steps:
        return None
    return f"{checkpoint} is at step {step}: --steps {steps} leaves nothing to train; pass --steps > {step}"


def _validate(config: TrainConfig, paths_here: bool, warmup_given: bool) -> None:
    """Raises ValueError naming the flag. `paths_here=False`: the paths are another machine's
    (the cluster's, checked at preview), so only what the shipped code itself holds is checked."""
    if config.launcher == "torchrun":
        if config.local:
            raise ValueError("--local starts an embedded Ray; it does not combine with --launcher torchrun")
        if is_uri(config.storage_path):
            raise ValueError("--launcher torchrun writes checkpoints to a local --storage-path only")
        if config.corpus_cache and is_uri(config.corpus_cache):
            raise ValueError("--launcher torchrun keeps the tokenized corpus in a local --corpus-cache only")
    for flag, folder in (("--resume-from", config.resume_from), ("--init-from", config.init_from)):
        if paths_here and folder and not is_uri(folder) and not Path(folder, TRAIN_STATE_FILE).is_file():
            raise ValueError(f"{flag} {folder!r}: not a checkpoint folder (no {TRAIN_STATE_FILE})")
    if config.resume_from and config.init_from:
        raise ValueError(
            "--resume-from continues a run (optimizer, step, data); --init-from takes a checkpoint's "
            "weights alone: give one"
        )
    if paths_here and config.resume_from and not is_uri(config.resume_from):
        # Here, before any worker starts; a checkpoint in a URI is read, and judged, by rank 0.
        state = json.loads(Path(config.resume_from, TRAIN_STATE_FILE).read_text())
        if problem := nothing_left_to_train(state.get("step", 0), config.steps, config.resume_from):
            raise ValueError(problem)
    if paths_here and not config.synthetic_data and not is_uri(config.data):
        corpus_files(config.data)
    if config.eval_data == SYNTHETIC:
        raise ValueError("--eval-data synthetic: random tokens hold nothing to learn; give a held-out corpus")
    if config.eval_every and config.eval_data is None:
        raise ValueError(f"--eval-every {config.eval_every} evaluates on --eval-data: set it")
    if config.early_stop_patience and config.eval_data is None:
        raise ValueError(
            f"--early-stop-patience {config.early_stop_patience} stops on the loss of --eval-data: set it"
        )
    if paths_here and config.eval_data and not is_uri(config.eval_data):
        corpus_files(config.eval_data, flag="--eval-data")
    shipped_config = is_shipped(config.model_config)
    if config.init == "random" and (paths_here or shipped_config):
        model = load_model_config(config.model_config)
        if config.seq_len > model.get("max_position_embeddings", config.seq_len):
            raise ValueError(
                f"--seq-len {config.seq_len} exceeds the model's max_position_embeddings "
                f"{model['max_position_embeddings']}"
            )
    # Only a --warmup-steps given: a preset's warm-up may outlast a short --steps (a smoke run).
    if warmup_given and config.warmup_steps > config.steps:
        raise ValueError(
            f"--warmup-steps {config.warmup_steps} exceeds --steps {config.steps}: the warm-up must end by the last step"
        )
    if config.attention == "flex" and not config.use_gpu:
        raise ValueError(
            "--attention flex needs GPUs: FlexAttention has no backward on the CPU; use --attention sdpa"
        )
    if config.float8 and not config.use_gpu:
        raise ValueError("--float8 needs GPUs with FP8 tensor cores; it does not combine with --no-gpu")
    if config.defer_grad_sync and config.grad_accum_steps == 1:
        raise ValueError(
            "--defer-grad-sync defers the reduce to a step's last micro-batch: set --grad-accum-steps > 1"
        )
    if config.max_failures < -1:
        raise ValueError(f"--max-failures {config.max_failures}: use -1 (unlimited) or a count >= 0")
    if config.workers is not None:
        check_hsdp_replicas(config.workers, config.hsdp_replicas)


# Settings that are always a path (a local one or a URI), and settings that are a path only when
# one exists here: otherwise a name (a Hub id, a shipped architecture, `bytes`).
_PATHS = ("storage_path", "corpus_cache", "resume_from", "init_from", "data", "eval_data")
_PATHS_IF_PRESENT = ("model_id", "tokenizer")


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def resolve_paths(values: dict[str, Any]) -> None:
    """Make local paths absolute, in place: Ray workers run in another working directory, where
    a relative path would name nothing (or, for --model-id, be taken for a Hub id)."""
    for key in _PATHS:
        if values[key] and values[key] != SYNTHETIC and not is_uri(values[key]):
            values[key] = _absolute(values[key])
    for key in _PATHS_IF_PRESENT:
        if values[key] != BYTE_TOKENIZER and Path(values[key]).expanduser().exists():
            values[key] = _absolute(values[key])
    model_config = values["model_config"]
    if not is_shipped(model_config) and Path(model_config).expanduser().is_file():
        values["model_config"] = _absolute(model_config)


def parse_flags(argv: Sequence[str], *, paths_here: bool = True) -> TrainConfig:
    """Flags over the chosen preset; raises `ArgumentsError` naming the flag on any bad value.

    `paths_here=False` checks flags meant for another machine: their paths are left as given
    and not looked up here (the run there checks them again with `paths_here=True`).
    """
    parser = build_parser()
    args = parser.parse_args(list(argv))
    values = dict(PRESETS[args.preset])
    for name in _FIELDS:
        flag_value = getattr(args, name)
        if flag_value is not None:  # --preset and --local always hold a value
            values[name] = flag_value
    if args.model_id is not None and args.tokenizer is None and values["tokenizer"] != BYTE_TOKENIZER:
        values["tokenizer"] = args.model_id
    values["storage_path"] = values.get("storage_path") or DEFAULT_STORAGE_PATH
    if paths_here:
        resolve_paths(values)
    values["run_name"] = (
        values.get("run_name") or f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    )
    config = TrainConfig(**values)
    try:
        _validate(config, paths_here, args.warmup_steps is not None)
    except ValueError as error:
        raise ArgumentsError(str(error)) from None
    return config


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Flags over the chosen preset; exits 2 with the usage text on any bad value."""
    try:
        return parse_flags(sys.argv[1:] if argv is None else argv)
    except ArgumentsError as error:
        parser = build_parser()
        parser.print_usage(sys.stderr)
        parser.exit(2, f"{parser.prog}: error: {error}\n")
