"""Every training setting, declared once: its field of `TrainConfig`, its flags, how its value is
parsed (a type of `training.config.flag_types`) and its --help text (no torch, no ray).

`training.config.run_config` derives the parser and --help from these fields and fills their defaults from
`training.config.presets`. The field order is the order of --help.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from training.config.corpus_files import SYNTHETIC
from training.config.flag_types import (
    column_name,
    folder_name,
    fraction,
    integer,
    non_negative_float,
    non_negative_int,
    parse_deadline,
    positive_float,
    positive_fraction,
    positive_int,
    replicas,
    step_count,
)
from training.config.presets import BYTE_TOKENIZER, DEFAULT_PRESET, PRESETS

# Ray Train's wait for a worker group to start, a restarted one included
# (ray/train/v2/_internal/constants.py, 60 s by default): the training driver sets its own default
# where it is unset, and the cluster's job sets it in its runtime environment.
WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
DEFAULT_STORAGE_PATH = "runs"
# The Kubernetes node a worker pod runs on, set from the downward API (`spec.nodeName`): a pod's
# hostname is its pod's name, which a replacement pod does not keep and `kubectl cordon` does not take.
NODE_NAME_ENV = "K8S_NODE_NAME"
# How packed documents see each other: "packed" attends across document boundaries with running
# positions; "isolated" restarts positions at each document, which confines its attention to
# itself; "auto" isolates every document on GPUs, and on CPUs only conversations (chat rows), where
# SDPA, the CPU's kernel, computes the masked blocks too.
DOCUMENT_ATTENTION = ("auto", "packed", "isolated")
# The attention kernels a run can take, as transformers names them (`attn_implementation`).
ATTENTION_KERNELS = {"sdpa": "sdpa", "flex": "flex_attention"}
# --attention's choices: a kernel, or "auto": flex on GPUs with isolated documents (it skips the
# blocks they mask out), else sdpa (FlexAttention has no backward on CPUs).
AUTO = "auto"
ATTENTION_CHOICES = (AUTO, *ATTENTION_KERNELS)
# The learning-rate schedules after the warm-up (training/components/optim.py).
LR_SCHEDULES = ("constant", "linear", "cosine", "wsd")
# The dtypes an exported Hugging Face model's weights can take (training/components/checkpoint.py maps them).
EXPORT_DTYPES = ("bf16", "fp16", "fp32")
DEADLINE_FLAG = "--deadline"
HANG_MARGIN_FLAG = "--hang-margin-s"
LEAVE_FAILING_NODE_FLAG = "--leave-failing-node"
RECOVERY_BUDGET_FLAG = "--recovery-budget-s"


@dataclass(frozen=True)
class Flag:
    """How a setting is given on the command line: its flags (the first names it), argparse's
    options for it (type, choices, action) and its --help; `unset` is what None means there."""

    names: tuple[str, ...]
    help: str
    options: dict[str, Any]
    unset: str = "none"


def setting(*names: str, help: str, unset: str = "none", **options: Any) -> Any:
    """A `TrainConfig` field with its flag; every setting has a flag."""
    return dataclasses.field(metadata={"flag": Flag(names, help, options, unset)})


def flag_of(field: dataclasses.Field[Any]) -> Flag:
    flag: Flag = field.metadata["flag"]
    return flag


_BOOL = argparse.BooleanOptionalAction


def switch_values(name: str) -> dict[str, bool]:
    """Each spelling of the on/off setting `name` and the value it gives, its `--no-` forms included
    (`use_gpu`: `--use-gpu`/`--gpu` true, `--no-use-gpu`/`--no-gpu` false); the last one given wins."""
    field = next(field for field in dataclasses.fields(TrainConfig) if field.name == name)
    names = flag_of(field).names
    return {**dict.fromkeys(names, True), **{f"--no-{flag[2:]}": False for flag in names}}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; plain values so Ray can ship it to workers."""

    preset: str = setting(
        "--preset",
        choices=sorted(PRESETS),
        default=DEFAULT_PRESET,
        help=f"settings every other flag overrides (default: {DEFAULT_PRESET})",
    )
    local: bool = setting(
        "--local",
        action="store_true",
        help="start an embedded Ray in this process instead of joining a cluster",
    )
    launcher: str = setting(
        "--launcher",
        choices=("ray", "torchrun"),
        help="ray: TorchTrainer; torchrun: run under torchrun, no Ray",
    )
    steps: int = setting("--steps", type=step_count, help="optimizer step to stop at")
    seq_len: int = setting("--seq-len", type=positive_int, help="tokens per sequence")
    batch_size: int = setting("--batch-size", type=positive_int, help="sequences per worker per micro-batch")
    grad_accum_steps: int = setting(
        "--grad-accum-steps",
        type=positive_int,
        help="micro-batches per optimizer step, their gradients summed (gradient accumulation)",
    )
    defer_grad_sync: bool = setting(
        "--defer-grad-sync",
        action=_BOOL,
        help="with --grad-accum-steps > 1, reduce gradients once per step instead of per "
        "micro-batch (keeps the whole model's fp32 gradients on every rank)",
    )
    lr: float = setting("--lr", "--learning-rate", type=positive_float, help="peak learning rate (AdamW)")
    warmup_steps: int = setting(
        "--warmup-steps", type=non_negative_int, help="steps of linear warm-up to --lr, from --lr / N"
    )
    lr_schedule: str = setting(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="after the warm-up: constant; linear or cosine decay to --min-lr-ratio x --lr at the "
        "last step; wsd: constant, then linear decay over the last --decay-ratio of the steps",
    )
    min_lr_ratio: float = setting(
        "--min-lr-ratio",
        type=fraction,
        help="the decaying schedules' last learning rate, as a fraction of --lr",
    )
    decay_ratio: float = setting(
        "--decay-ratio",
        type=positive_fraction,
        help="--lr-schedule wsd: the fraction of the steps after the warm-up spent decaying",
    )
    weight_decay: float = setting("--weight-decay", type=non_negative_float, help="AdamW weight decay")
    max_grad_norm: float = setting(
        "--max-grad-norm", type=non_negative_float, help="gradient clipping norm; 0 disables"
    )
    seed: int = setting(
        "--seed", type=integer, help="seed for weights, synthetic data and the order of corpus rows"
    )
    workers: int | None = setting(
        "--workers", type=positive_int, help="training workers", unset="one per GPU of the cluster"
    )
    use_gpu: bool = setting(
        "--use-gpu", "--gpu", action=_BOOL, help="give each worker --gpus-per-worker GPUs"
    )
    gpus_per_worker: float = setting(
        "--gpus-per-worker", type=positive_float, help="GPUs each worker reserves"
    )
    cpus_per_worker: float = setting(
        "--cpus-per-worker", type=positive_float, help="CPUs each worker reserves"
    )
    model_id: str = setting(
        "--model-id", help="Hugging Face model id for pretrained weights and the default tokenizer"
    )
    model_config: str = setting(
        "--model-config",
        help="architecture for --init random: a name in training/architectures or a JSON file",
    )
    init: str = setting(
        "--init", choices=("random", "pretrained"), help="random weights or the model id's weights"
    )
    tokenizer: str = setting(
        "--tokenizer", help=f"'{BYTE_TOKENIZER}' or a Hugging Face tokenizer id/path (real-text data only)"
    )
    data: str = setting(
        "--data", help=f"'{SYNTHETIC}' (random tokens) or a corpus file/folder of .txt/.md/.jsonl/.parquet"
    )
    eval_data: str | None = setting(
        "--eval-data", help="held-out corpus (file, folder or URI, formats as --data) to report the loss of"
    )
    eval_every: int = setting(
        "--eval-every",
        type=non_negative_int,
        help="with --eval-data: evaluate every N steps and after the last; 0: after the last only",
    )
    text_column: str = setting(
        "--text-column", type=column_name, help="the .jsonl/.parquet column that holds each document's text"
    )
    document_attention: str = setting(
        "--document-attention",
        choices=DOCUMENT_ATTENTION,
        help="packed: documents in a row attend to the ones before them; isolated: each attends only "
        "to itself (positions restart at each document); auto: isolated with --gpu, and without it "
        "isolated for conversations ('messages' rows), packed for text",
    )
    attention: str = setting(
        "--attention",
        choices=ATTENTION_CHOICES,
        help="attention kernel: sdpa (PyTorch's scaled_dot_product_attention); flex (FlexAttention, "
        "GPUs only: with isolated documents it skips the masked blocks, which SDPA computes); auto: "
        "flex with --gpu and isolated documents (sdpa with a warning if flex does not compile on the "
        "GPU at start), else sdpa",
    )
    storage_path: str = setting(
        "--storage-path",
        help="where runs and checkpoints go: a local folder or s3://bucket/prefix "
        f"(default: {DEFAULT_STORAGE_PATH})",
    )
    corpus_cache: str | None = setting(
        "--corpus-cache",
        help="where tokenized corpora are kept for later runs: a local folder or s3://bucket/prefix; "
        "delete it to re-tokenize",
        unset="<storage-path>/corpus-cache",
    )
    run_name: str = setting(
        "--run-name",
        type=folder_name,
        help="run folder name; reusing one resumes from its latest checkpoint "
        "(default: <preset>-<YYYYmmdd-HHMMSS>-<process id>)",
    )
    resume_from: str | None = setting(
        "--resume-from",
        help="continue from this checkpoint folder (weights, optimizer, step, data position) when the "
        "run has none of its own",
    )
    init_from: str | None = setting(
        "--init-from",
        help="start from this checkpoint folder's weights alone: a fresh optimizer, step 1, the first "
        "batches (a fine-tune of a saved run)",
    )
    checkpoint_every: int = setting(
        "--checkpoint-every", type=non_negative_int, help="checkpoint every N steps and at the end; 0 never"
    )
    checkpoint_interval_s: float = setting(
        "--checkpoint-interval-s",
        type=non_negative_float,
        help="also checkpoint when this many seconds passed since the last one, lengthened so that "
        "checkpoints take at most 3 percent of the run's time (measured: each one's stall and how much "
        "it slowed the steps it was written behind); 0 never. Checkpoints before the run's last are "
        "written behind the next steps",
    )
    keep_checkpoints: int = setting(
        "--keep-checkpoints",
        type=positive_int,
        help="checkpoints kept: the N latest, or with --eval-data the N of lowest eval_loss (every "
        "checkpoint is evaluated); the latest is always kept too, to resume from",
    )
    early_stop_patience: int = setting(
        "--early-stop-patience",
        type=non_negative_int,
        help="with --eval-data: stop after N evaluations in a row without a lower eval_loss than the "
        "best so far (the run's last checkpoint is written at that step); 0 never",
    )
    max_failures: int = setting(
        "--max-failures", type=integer, help="worker-group restarts from the latest checkpoint; -1 unlimited"
    )
    recovery_budget_s: float = setting(
        RECOVERY_BUDGET_FLAG,
        type=positive_float,
        help="seconds the run's restarts may spend recovering (fault to the next finished step) in all; "
        "past them no further restart",
    )
    leave_failing_node: bool = setting(
        LEAVE_FAILING_NODE_FLAG,
        action="store_true",
        help="with two faults in a row on one node, wait within --recovery-budget-s for that node to be "
        "taken out (rank 0 prints a NODE_LEAVING line; the TrainingRun cordons the node and deletes its "
        "Ray worker pod, and EKS auto repair replaces it) instead of ending the run",
    )
    hang_margin_s: float = setting(
        HANG_MARGIN_FLAG,
        type=non_negative_float,
        help="seconds added to 2 x the median recent step time (for an evaluation or a checkpoint's "
        "commit, 2 x the last one's) before it counts as hung: its ranks that did not arrive are named "
        "and the attempt restarts from the latest checkpoint",
    )
    hsdp_replicas: int = setting(
        "--hsdp-replicas",
        type=replicas,
        help="HSDP replica groups (shard inside, replicate across); 'auto' = nodes",
    )
    compile: bool = setting("--compile", action=_BOOL, help="torch.compile each decoder layer and the loss")
    activation_checkpointing: bool = setting(
        "--activation-checkpointing", action=_BOOL, help="recompute decoder layers"
    )
    float8: bool = setting(
        "--float8",
        action=_BOOL,
        help="float8 matmuls in the decoder's linear layers (torchao; GPUs with FP8 tensor cores: "
        "L4, H100, H200)",
    )
    loss_chunk_tokens: int = setting(
        "--loss-chunk-tokens", type=positive_int, help="tokens per chunk of the fused lm_head + cross-entropy"
    )
    reshard_after_forward: bool = setting(
        "--reshard-after-forward", action=_BOOL, help="FSDP2 frees layers after forward"
    )
    export_hf: bool = setting("--export-hf", action=_BOOL, help="also save a Hugging Face model at the end")
    export_dtype: str = setting(
        "--export-dtype",
        choices=EXPORT_DTYPES,
        help="dtype of the exported Hugging Face weights (the master weights stay fp32)",
    )
    tensorboard: bool = setting(
        "--tensorboard",
        action=_BOOL,
        help="write TensorBoard event files into the run folder's tensorboard/ (rank 0)",
    )
    deadline: str | None = setting(
        DEADLINE_FLAG,
        type=parse_deadline,
        help="ISO 8601 time in UTC (2026-12-05T07:00:00Z, a reservation's EndDate): stop with a "
        "checkpoint of the last step, exit 0, when the next step and its checkpoint would not end by it",
        unset="no deadline",
    )
    line_rate_gbps: float | None = setting(
        "--line-rate-gbps",
        type=positive_float,
        help="each node's network line rate in Gbit/s, for the summary's share of it that EFA carried",
        unset="no share reported",
    )

    @property
    def synthetic_data(self) -> bool:
        return self.data == SYNTHETIC

    @property
    def packing_attention(self) -> str:
        """--document-attention as the packer applies it (`training.data.documents.document_tokens`): `auto`
        isolates every document on GPUs and keeps its CPU meaning (conversations only) without."""
        if self.document_attention == AUTO and self.use_gpu:
            return "isolated"
        return self.document_attention

    @property
    def wanted_attention(self) -> str:
        """The kernel --attention asks for: `auto` is flex on GPUs where documents are isolated
        (`training.model.attention.attention_kernel` falls back to sdpa where flex does not compile),
        else sdpa: on CPUs, and for causal rows (packed text, synthetic tokens), which cuDNN's
        causal SDPA kernel runs as measured."""
        if self.attention == AUTO:
            isolated = not self.synthetic_data and self.packing_attention == "isolated"
            return "flex" if self.use_gpu and isolated else "sdpa"
        return self.attention

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        return cls(**values)
