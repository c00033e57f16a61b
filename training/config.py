"""Run configuration: presets, command-line flags and their validation (no torch, no ray).

A preset fills every field; flags given on the command line override it. Bad
values are reported through argparse, so the CLI exits 2 with its usage text
instead of failing later inside a Ray worker.

This parser is the one declaration of every training setting. The Pulumi program validates
the stack's `training:` block with it at preview (`infra.training_settings`): each camelCase key
is the flag of the same name (`seqLen: 256` is `--seq-len 256`), so a flag added here is a stack
key with no other edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_DIR / "configs"
SHIPPED_CORPUS = PACKAGE_DIR / "corpus"
SYNTHETIC = "synthetic"
BYTE_TOKENIZER = "bytes"
QWEN_1_5B = "Qwen/Qwen2.5-1.5B"
# A corpus file's suffix says how it is read: a whole text document, JSON lines, or Parquet
# rows, each row's document in its --text-column (or a conversation in its "messages" column).
CORPUS_FORMATS = {".txt": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
CORPUS_SUFFIXES = tuple(CORPUS_FORMATS)
TRAIN_STATE_FILE = "train_state.json"
DEFAULT_PRESET = "tiny"
DEFAULT_STORAGE_PATH = "runs"
DEFAULT_TEXT_COLUMN = "text"
# How packed documents see each other: "packed" attends across document boundaries with running
# positions; "isolated" restarts positions at each document, which confines its attention to
# itself; "auto" isolates conversations (chat rows) and packs plain text.
DOCUMENT_ATTENTION = ("auto", "packed", "isolated")
# What a setting left unset (None) means, for --help.
UNSET_MEANS = {
    "workers": "one per GPU of the cluster",
    "resume_from": "none",
    "init_from": "none",
    "eval_data": "none",
}
# The learning-rate schedules after the warm-up (training/optim.py).
LR_SCHEDULES = ("constant", "linear", "cosine", "wsd")
# The dtypes an exported Hugging Face model's weights can take (training/checkpoint.py maps them).
EXPORT_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; plain values so Ray can ship it to workers."""

    preset: str
    model_id: str
    model_config: str
    init: str
    tokenizer: str
    data: str
    eval_data: str | None
    eval_every: int
    text_column: str
    document_attention: str
    steps: int
    seq_len: int
    batch_size: int
    grad_accum_steps: int
    defer_grad_sync: bool
    lr: float
    warmup_steps: int
    lr_schedule: str
    min_lr_ratio: float
    decay_ratio: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    workers: int | None
    use_gpu: bool
    gpus_per_worker: float
    cpus_per_worker: float
    storage_path: str
    run_name: str
    resume_from: str | None
    init_from: str | None
    checkpoint_every: int
    max_failures: int
    hsdp_replicas: int
    compile: bool
    activation_checkpointing: bool
    float8: bool
    loss_chunk_tokens: int
    reshard_after_forward: bool
    export_hf: bool
    export_dtype: str
    tensorboard: bool
    launcher: str
    local: bool

    @property
    def synthetic_data(self) -> bool:
        return self.data == SYNTHETIC

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return cls(**values)


_BASE: dict[str, Any] = {
    "model_id": QWEN_1_5B,
    "model_config": "qwen2.5-1.5b",
    "init": "pretrained",
    "tokenizer": QWEN_1_5B,
    "data": SYNTHETIC,
    "eval_data": None,
    "eval_every": 0,
    "text_column": DEFAULT_TEXT_COLUMN,
    "document_attention": "auto",
    "grad_accum_steps": 1,
    "defer_grad_sync": False,
    "lr": 2e-5,
    "warmup_steps": 0,
    "lr_schedule": "constant",
    "min_lr_ratio": 0.0,
    "decay_ratio": 0.2,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "seed": 0,
    "workers": None,
    "use_gpu": True,
    "gpus_per_worker": 1.0,
    "cpus_per_worker": 1.0,
    "resume_from": None,
    "init_from": None,
    "checkpoint_every": 0,
    "max_failures": 0,
    "hsdp_replicas": 1,
    "compile": False,
    "activation_checkpointing": False,
    "float8": False,
    "loss_chunk_tokens": 4096,
    "reshard_after_forward": True,
    "export_hf": False,
    "export_dtype": "bf16",
    "tensorboard": True,
    "launcher": "ray",
}

PRESETS: dict[str, dict[str, Any]] = {
    # The CPU demo and test model: two tiny Qwen2 layers over bytes of the shipped corpus.
    "tiny": {
        **_BASE,
        "model_id": "tiny",
        "model_config": "tiny",
        "init": "random",
        "tokenizer": BYTE_TOKENIZER,
        "data": str(SHIPPED_CORPUS),
        "steps": 30,
        "seq_len": 128,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 3,
        "workers": 2,
        "use_gpu": False,
        "checkpoint_every": 10,
        "loss_chunk_tokens": 1024,
    },
    # AWS's reference job: seq 128, batch 1, 5 steps of random tokens, so the
    # EFA-vs-TCP figures stay comparable with the published 0.2513/0.5173 steps/s.
    "smoke": {
        **_BASE,
        "steps": 5,
        "seq_len": 128,
        "batch_size": 1,
        "max_grad_norm": 0.0,
    },
    # Tuned for 2 x g6.12xlarge (8 x L4, 22.5 GiB usable each): shard inside a node,
    # replicate across nodes, compiled layers, fused loss, two 4096-token sequences per GPU
    # with activation checkpointing. Measured at world size 8 (fake process group,
    # bench/results/h200-deferred-and-memory.json): 10.1 GiB per rank and the fastest per-rank
    # rate of the HSDP candidates that fit (31.6k tokens/s on an H200, against 16.2k for one
    # sequence without checkpointing at 16.1 GiB); two sequences without checkpointing need
    # 25.1 GiB. HSDP rather than FSDP over all 8: only the gradient all-reduce crosses the
    # shared 40 Gbps link between the nodes, not every layer's all-gather and reduce-scatter.
    "throughput": {
        **_BASE,
        "steps": 50,
        "seq_len": 4096,
        "batch_size": 2,
        "warmup_steps": 10,
        "checkpoint_every": 0,
        "hsdp_replicas": 0,
        "compile": True,
        "activation_checkpointing": True,
    },
}


def _number(text: str, kind: type[int] | type[float], expected: str) -> Any:
    """The value of `text`, or an argparse error that says what was expected (argparse
    prefixes it with the flag's name)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not math.isfinite(value):  # float("inf"), float("nan") parse; no setting wants them
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# A run's folder under --storage-path: one path segment (no `/`, not `.` or `..`), nothing a shell
# or a URL would read differently.
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _run_name(text: str) -> str:
    if not _RUN_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a folder name of letters, digits and . _ - (at most 128, no '/'), got {text!r}"
        )
    return text


def _integer(text: str) -> int:
    return _number(text, int, "a whole number")


def _positive_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# More optimizer steps than any fine-tune here takes: 10 million steps of the tiny CPU model's
# 0.1 s would run 12 days, of the throughput preset's 1 s on L4s 4 months. A larger count is a slip.
MAX_STEPS = 10_000_000


def _step_count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_STEPS:_}, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text, float, "a number > 0")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _number(text, float, "a number from 0 to 1")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


def _positive_fraction(text: str) -> float:
    value = _number(text, float, "a number > 0 and <= 1")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1, got {text}")
    return value


def _replicas(text: str) -> int:
    """`auto` (0: one replica group per node) or a positive count."""
    if text == "auto":
        return 0
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count >= 1, got {text!r}")
    return int(text)


def _column_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a column name, got {text!r}")
    return text


def _shown(key: str, value: Any) -> str:
    """A setting's value as --help shows it."""
    if value is None:
        return UNSET_MEANS.get(key, "none")
    if isinstance(value, bool):
        return "on" if value else "off"
    if key == "hsdp_replicas" and value == 0:
        return "auto"
    if key == "model_id" and (CONFIG_DIR / f"{value}.json").is_file():
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
    parser = _Parser(
        prog="python -m training",
        description=(
            "Train Qwen2.5 with FSDP2 in bf16 on Ray Train (or torchrun). A preset sets every "
            f"value; flags override it. Defaults below are --preset {DEFAULT_PRESET}'s, followed "
            "by the other presets' where they differ."
        ),
    )

    def add(*flags: str, **options: Any) -> None:
        action = parser.add_argument(*flags, **options)
        if action.dest in PRESETS[DEFAULT_PRESET]:
            action.help = f"{action.help} {preset_default(action.dest)}".replace("%", "%%")

    add(
        "--preset",
        choices=sorted(PRESETS),
        default=DEFAULT_PRESET,
        help=f"settings every other flag overrides (default: {DEFAULT_PRESET})",
    )
    add(
        "--local",
        action="store_true",
        help="start an embedded Ray in this process instead of joining a cluster",
    )
    add(
        "--launcher",
        choices=("ray", "torchrun"),
        help="ray: TorchTrainer; torchrun: run under torchrun, no Ray",
    )
    add("--steps", type=_step_count, help="optimizer step to stop at")
    add("--seq-len", type=_positive_int, help="tokens per sequence")
    add("--batch-size", type=_positive_int, help="sequences per worker per micro-batch")
    add(
        "--grad-accum-steps",
        type=_positive_int,
        help="micro-batches per optimizer step, their gradients summed (gradient accumulation)",
    )
    add(
        "--defer-grad-sync",
        action=argparse.BooleanOptionalAction,
        help="with --grad-accum-steps > 1, reduce gradients once per step instead of per "
        "micro-batch (keeps the whole model's fp32 gradients on every rank)",
    )
    add("--lr", "--learning-rate", dest="lr", type=_positive_float, help="peak learning rate (AdamW)")
    add("--warmup-steps", type=_non_negative_int, help="steps of linear warm-up to --lr, from --lr / N")
    add(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="after the warm-up: constant; linear or cosine decay to --min-lr-ratio x --lr at the "
        "last step; wsd: constant, then linear decay over the last --decay-ratio of the steps",
    )
    add(
        "--min-lr-ratio",
        type=_fraction,
        help="the decaying schedules' last learning rate, as a fraction of --lr",
    )
    add(
        "--decay-ratio",
        type=_positive_fraction,
        help="--lr-schedule wsd: the fraction of the steps after the warm-up spent decaying",
    )
    add("--weight-decay", type=_non_negative_float, help="AdamW weight decay")
    add("--max-grad-norm", type=_non_negative_float, help="gradient clipping norm; 0 disables")
    add("--seed", type=_integer, help="seed for weights, synthetic data and the order of corpus rows")
    add("--workers", type=_positive_int, help="training workers")
    add(
        "--use-gpu",
        "--gpu",
        action=argparse.BooleanOptionalAction,
        help="give each worker --gpus-per-worker GPUs",
    )
    add("--gpus-per-worker", type=_positive_float, help="GPUs each worker reserves")
    add("--cpus-per-worker", type=_positive_float, help="CPUs each worker reserves")
    add("--model-id", help="Hugging Face model id for pretrained weights and the default tokenizer")
    add("--model-config", help="architecture for --init random: a name in training/configs or a JSON file")
    add("--init", choices=("random", "pretrained"), help="random weights or the model id's weights")
    add("--tokenizer", help="'bytes' or a Hugging Face tokenizer id/path (real-text data only)")
    add("--data", help="'synthetic' (random tokens) or a corpus file/folder of .txt/.md/.jsonl/.parquet")
    add("--eval-data", help="held-out corpus (file, folder or URI, formats as --data) to report the loss of")
    add(
        "--eval-every",
        type=_non_negative_int,
        help="with --eval-data: evaluate every N steps and after the last; 0: after the last only",
    )
    add("--text-column", type=_column_name, help="the .jsonl/.parquet column that holds each document's text")
    add(
        "--document-attention",
        choices=DOCUMENT_ATTENTION,
        help="packed: documents in a row attend to the ones before them; isolated: each attends only "
        "to itself (positions restart at each document); auto: isolated for conversations "
        "('messages' rows), packed for text",
    )
    add(
        "--storage-path",
        help=f"where runs and checkpoints go: a local folder or s3://bucket/prefix (default: {DEFAULT_STORAGE_PATH})",
    )
    add(
        "--run-name",
        type=_run_name,
        help="run folder name; reusing one resumes from its latest checkpoint "
        "(default: <preset>-<YYYYmmdd-HHMMSS>-<process id>)",
    )
    add(
        "--resume-from",
        help="continue from this checkpoint folder (weights, optimizer, step, data position) when the "
        "run has none of its own",
    )
    add(
        "--init-from",
        help="start from this checkpoint folder's weights alone: a fresh optimizer, step 1, the first "
        "batches (a fine-tune of a saved run)",
    )
    add("--checkpoint-every", type=_non_negative_int, help="checkpoint every N steps and at the end; 0 never")
    add(
        "--max-failures", type=_integer, help="worker-group restarts from the latest checkpoint; -1 unlimited"
    )
    add(
        "--hsdp-replicas",
        type=_replicas,
        help="HSDP replica groups (shard inside, replicate across); 'auto' = nodes",
    )
    add(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile each decoder layer and the loss",
    )
    add("--activation-checkpointing", action=argparse.BooleanOptionalAction, help="recompute decoder layers")
    add(
        "--float8",
        action=argparse.BooleanOptionalAction,
        help="float8 matmuls in the decoder's linear layers (torchao; GPUs with FP8 tensor cores: "
        "L4, H100, H200)",
    )
    add(
        "--loss-chunk-tokens",
        type=_positive_int,
        help="tokens per chunk of the fused lm_head + cross-entropy",
    )
    add(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        help="FSDP2 frees layers after forward",
    )
    add(
        "--export-hf", action=argparse.BooleanOptionalAction, help="also save a Hugging Face model at the end"
    )
    add(
        "--export-dtype",
        choices=EXPORT_DTYPES,
        help="dtype of the exported Hugging Face weights (the master weights stay fp32)",
    )
    add(
        "--tensorboard",
        action=argparse.BooleanOptionalAction,
        help="write TensorBoard event files into the run folder's tensorboard/ (rank 0)",
    )
    return parser


def is_uri(path: str) -> bool:
    """s3://, gs:// and the like, as opposed to a local path."""
    return "://" in path


def resolve_model_config(name_or_path: str) -> Path:
    """A shipped architecture name (`tiny`) or a path to a config JSON."""
    shipped = CONFIG_DIR / f"{name_or_path}.json"
    if shipped.is_file():
        return shipped
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
    raise ValueError(f"--model-config {name_or_path!r}: neither a shipped config ({names}) nor a JSON file")


def load_model_config(name_or_path: str) -> dict[str, Any]:
    path = resolve_model_config(name_or_path)
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"--model-config {name_or_path}: {path} is not a readable JSON file ({error})"
        ) from None
    if not isinstance(values, dict):
        raise ValueError(
            f"--model-config {name_or_path}: {path} holds no JSON object (a transformers config)"
        )
    return values


def corpus_files(data: str, flag: str = "--data") -> list[str]:
    """Corpus files under a path, sorted so every reader sees the same order."""
    path = Path(data)
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        raise ValueError(
            f"{flag} {data!r}: no such file or folder" + (" (or use 'synthetic')" if flag == "--data" else "")
        )
    files = [str(p.resolve()) for p in candidates if p.suffix in CORPUS_SUFFIXES]
    if not files:
        raise ValueError(f"{flag} {data!r}: no {'/'.join(CORPUS_SUFFIXES)} files in it")
    return files


def corpus_format(path: str) -> str:
    """'text', 'json' or 'parquet', from the file's suffix."""
    suffix = Path(path).suffix
    if suffix not in CORPUS_FORMATS:
        raise ValueError(f"unsupported corpus file {path}: use {'/'.join(CORPUS_SUFFIXES)}")
    return CORPUS_FORMATS[suffix]


def check_hsdp_replicas(workers: int, replicas: int) -> None:
    """HSDP shards inside each replica group, so the workers must split evenly into the groups."""
    if replicas and workers % replicas:
        raise ValueError(f"{workers} workers are not a multiple of --hsdp-replicas {replicas}")


def _validate(config: TrainConfig, paths_here: bool, warmup_given: bool) -> None:
    """Raises ValueError naming the flag. `paths_here=False`: the paths are another machine's
    (the cluster's, checked at preview), so only what the shipped code itself holds is checked."""
    if config.launcher == "torchrun":
        if config.local:
            raise ValueError("--local starts an embedded Ray; it does not combine with --launcher torchrun")
        if is_uri(config.storage_path):
            raise ValueError("--launcher torchrun writes checkpoints to a local --storage-path only")
    for flag, folder in (("--resume-from", config.resume_from), ("--init-from", config.init_from)):
        if paths_here and folder and not is_uri(folder) and not Path(folder, TRAIN_STATE_FILE).is_file():
            raise ValueError(f"{flag} {folder!r}: not a checkpoint folder (no {TRAIN_STATE_FILE})")
    if config.resume_from and config.init_from:
        raise ValueError(
            "--resume-from continues a run (optimizer, step, data); --init-from takes a checkpoint's "
            "weights alone: give one"
        )
    if paths_here and not config.synthetic_data and not is_uri(config.data):
        corpus_files(config.data)
    if config.eval_data == SYNTHETIC:
        raise ValueError("--eval-data synthetic: random tokens hold nothing to learn; give a held-out corpus")
    if config.eval_every and config.eval_data is None:
        raise ValueError(f"--eval-every {config.eval_every} evaluates on --eval-data: set it")
    if paths_here and config.eval_data and not is_uri(config.eval_data):
        corpus_files(config.eval_data, flag="--eval-data")
    shipped_config = (CONFIG_DIR / f"{config.model_config}.json").is_file()
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
_PATHS = ("storage_path", "resume_from", "init_from", "data", "eval_data")
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
    if not (CONFIG_DIR / f"{model_config}.json").is_file() and Path(model_config).expanduser().is_file():
        values["model_config"] = _absolute(model_config)


def parse_flags(argv: Sequence[str], *, paths_here: bool = True) -> TrainConfig:
    """Flags over the chosen preset; raises `ArgumentsError` naming the flag on any bad value.

    `paths_here=False` checks flags meant for another machine: their paths are left as given
    and not looked up here (the run there checks them again with `paths_here=True`).
    """
    parser = build_parser()
    args = parser.parse_args(list(argv))
    values = dict(PRESETS[args.preset])
    for field in dataclasses.fields(TrainConfig):
        flag_value = getattr(args, field.name, None)
        if flag_value is not None:
            values[field.name] = flag_value
    values["preset"] = args.preset
    values["local"] = args.local
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
