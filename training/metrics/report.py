"""The run's metrics as typed records, and their log lines, free of third-party imports.

The training job prints one machine-readable line per step and ends the driver's
stdout with one JSON summary. The Pulumi side reads both out of `ray job logs`
without torch or ray installed, so everything here is plain Python.

MFU follows the PaLM / torchtitan convention: model FLOPs per token are
6·N + 12·L·H·S (N the parameters that take part in a matmul, L layers, H the
attention width heads × head_dim, S the sequence length), and the attention
term is NOT halved for causal masking; `mfu_causal` gives the halved value, and
`mfu_done` counts it over the query-key pairs the rows' documents attend.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STEP_MARKER = "TRAIN_STEP"
# The line a restarted rank 0 prints when a node whose faults repeat must leave the job (with
# `--leave-failing-node`): whoever follows the job and holds the Kubernetes API (the TrainingRun)
# cordons that node and deletes its worker pod, so the restart waits for the node's replacement.
NODE_LEAVING_MARKER = "NODE_LEAVING"


@dataclass(frozen=True)
class StepMetrics:
    """One optimizer step, as printed on its TRAIN_STEP line."""

    step: int
    steps: int
    loss: float
    lr: float
    grad_norm: float
    eval_loss: float | None  # None on steps without an evaluation (--eval-data, --eval-every)
    eval_perplexity: float | None
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    peak_mem_gib: float
    # Bytes/s moved through each node's EFA ports (`efa_sysfs.MOVED`) since the step before (by host
    # name; None for a node without them); absent on a machine without EFA (`training.metrics.efa_meter`).
    efa_bytes_per_s: dict[str, float | None] | None = None

    def as_dict(self) -> dict[str, Any]:
        return _without_absent(dataclasses.asdict(self))


# Fields that a run without EFA leaves out of its records, rather than writing them as null.
EFA_FIELDS = ("efa_bytes_per_s", "efa_bytes_per_step", "efa_line_rate_fraction")


def _without_absent(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in EFA_FIELDS or value is not None}


# An attempt of the run summary's `attempts`, in this order: the restart's number (1 = the first),
# its cause in one line, the failed worker's node or pod where known, the last step finished before
# the fault, the checkpoint's step it resumed from, the steps lost, and the seconds from the fault's
# detection to the first step finished after the restart (None when none finished).
ATTEMPT_KEYS = (
    "attempt",
    "cause",
    "node",
    "failed_after_step",
    "resumed_from_step",
    "lost_steps",
    "recovery_s",
)


@dataclass(frozen=True)
class RunSummary:
    """A finished run: the JSON line the driver prints (before its closing line for people,
    `training.metrics.artifacts.closing_line`) and the run folder's summary.json."""

    world_size: int
    steps: int
    start_step: int
    resharded: bool  # resumed on another world size than the checkpoint's
    steps_run: int
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    steps_per_s: float | None
    mfu: float | None
    mfu_causal: float | None
    # MFU on the work done: attention's FLOPs counted over the query-key pairs the rows' documents
    # attend (`attended_share` of the S × S scores), the value a run of isolated documents is
    # judged by (docs/training/mfu.md).
    mfu_done: float | None
    attended_share: float | None
    loss_first: float | None
    loss_last: float | None
    eval_loss: float | None  # the last evaluation's; None without --eval-data
    eval_perplexity: float | None
    lr_schedule: str
    peak_mem_gib: float
    step_time_s: float | None
    duration_s: float
    gpu_name: str | None
    device: str
    model: str
    init: str
    parameters: int
    flops_per_token: float
    preset: str
    data: str
    seq_len: int
    batch_size: int
    grad_accum_steps: int
    tokens_per_step: int
    # Over the steps this run ran: the input tokens, and those that were loss targets (fewer
    # when chat data masks all but the assistant's turns, or isolated documents their first token).
    tokens_seen: int
    loss_tokens: int
    hsdp_replicas: int
    compile: bool
    activation_checkpointing: bool
    run_name: str
    run_dir: str | None = None
    summary_path: str | None = None
    # With --eval-data: the lowest held-out loss and its step (a checkpoint kept, where the step
    # had one), and whether --early-stop-patience ended the run before --steps.
    best_eval_loss: float | None = None
    best_eval_step: int | None = None
    stopped_early: bool = False
    # Per corpus ("data", "eval_data"; none for synthetic tokens): documents packed, those longer
    # than a row truncated to one and the tokens that cost, and filler tokens (no loss) that end
    # rows where the next whole document did not fit (training.data.packing.PackingStats).
    packing: dict[str, dict[str, int]] | None = None
    # The last checkpoint's seconds: its write and, on Ray, its upload (the HF export too where
    # it had one); None where the run wrote none.
    checkpoint_s: float | None = None
    # The step the run ended at and the steps from there to --steps (0 when it ran them all); with
    # --deadline (ISO 8601, UTC), whether it stopped before --steps to end by that time.
    last_step: int | None = None
    steps_left: int | None = None
    deadline: str | None = None
    stopped_at_deadline: bool = False
    # Over the steps after the first (as `step_time_s`), per node: EFA bytes/s and bytes per step
    # (`efa_sysfs.MOVED`), and the busiest node's share of its ports' capacity both ways
    # (2 x --line-rate-gbps); absent without EFA (and the share without --line-rate-gbps).
    efa_bytes_per_s: dict[str, float | None] | None = None
    efa_bytes_per_step: dict[str, float | None] | None = None
    efa_line_rate_fraction: float | None = None
    # The worker-group restarts this run made (--max-failures), each as
    # `ATTEMPT_KEYS`: cause, node, steps lost, seconds to recover.
    restarts: int = 0
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return _without_absent(dataclasses.asdict(self))


STEP_KEYS = tuple(field.name for field in dataclasses.fields(StepMetrics))
# What a step line must carry; the EFA rate only where there is EFA.
REQUIRED_STEP_KEYS = tuple(key for key in STEP_KEYS if key not in EFA_FIELDS)
# Keys a step line has carried from the first release on; the later ones (the learning rate, the
# gradient norm, the held-out loss) read as None from a job started by an older version, which a
# later `pulumi up` still follows.
FIRST_STEP_KEYS = (
    "step",
    "steps",
    "loss",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_mem_gib",
)
# What a summary must hold to be recognised in a log (older summaries lack the newer fields).
SUMMARY_KEYS = (
    "world_size",
    "steps",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "loss_first",
    "loss_last",
    "peak_mem_gib",
    "step_time_s",
    "duration_s",
    "gpu_name",
    "run_dir",
    "summary_path",
)


def _json_number(value: Any) -> Any:
    """NaN and infinities are not JSON: a diverged loss becomes null, not a parse error."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _mapping(record: StepMetrics | RunSummary | Mapping[str, Any]) -> Mapping[str, Any]:
    return record.as_dict() if isinstance(record, StepMetrics | RunSummary) else record


def format_step_line(metrics: StepMetrics | Mapping[str, Any]) -> str:
    """One line per step: the marker, then the step metrics as compact JSON."""
    metrics = _mapping(metrics)
    missing = [key for key in REQUIRED_STEP_KEYS if key not in metrics]
    if missing:
        raise KeyError(f"step metrics lack {missing}")
    payload = {key: _json_number(metrics[key]) for key in STEP_KEYS if key in metrics}
    return f"{STEP_MARKER} {json.dumps(payload, separators=(',', ':'))}"


def parse_step_line(line: str) -> dict | None:
    """The metrics of a step line, also when a log prefix (Ray's worker tag) precedes it."""
    position = line.find(STEP_MARKER + " ")
    if position < 0:
        return None
    try:
        payload = json.loads(line[position + len(STEP_MARKER) + 1 :])
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or any(key not in payload for key in FIRST_STEP_KEYS):
        return None
    return {key: payload.get(key) for key in STEP_KEYS if key in REQUIRED_STEP_KEYS or key in payload}


def format_node_leaving_line(node: str, why: str, wait_s: float) -> str:
    """The job's request that `node` leave it: machine-readable first, then why and how long the
    ranks wait for the node to be taken out before the run ends."""
    payload = json.dumps({"node": node, "wait_s": round(wait_s)}, separators=(",", ":"))
    return f"{NODE_LEAVING_MARKER} {payload} {why}"


def parse_node_leaving_line(line: str) -> str | None:
    """The node a job's line asks to take out, also after a log prefix (Ray's worker tag); None for
    any other line."""
    position = line.find(NODE_LEAVING_MARKER + " ")
    if position < 0:
        return None
    try:
        payload, _ = json.JSONDecoder().raw_decode(line[position + len(NODE_LEAVING_MARKER) + 1 :])
    except json.JSONDecodeError:
        return None
    node = payload.get("node") if isinstance(payload, dict) else None
    return node if isinstance(node, str) and node else None


def format_progress_line(
    metrics: StepMetrics | Mapping[str, Any], deadline_left_s: float | None = None
) -> str:
    """The human-readable console line for a step; with --deadline, the time left until it."""
    metrics = _mapping(metrics)
    mfu = metrics.get("mfu")
    mfu_text = "n/a" if mfu is None else f"{100 * mfu:.1f}%"
    width = len(str(metrics["steps"]))
    loss = metrics["loss"]
    loss_text = "nan" if loss is None or not math.isfinite(loss) else f"{loss:.4f}"
    eval_loss = metrics.get("eval_loss")
    eval_text = (
        "" if eval_loss is None else f" | eval loss {eval_loss:.4f} (ppl {metrics['eval_perplexity']:.2f})"
    )
    grad_norm = metrics["grad_norm"]
    efa = metrics.get("efa_bytes_per_s")
    efa_text = (
        ""
        if efa is None
        else " | EFA "
        + "/".join("n/a" if rate is None else f"{rate / 1e9:.2f}" for rate in efa.values())
        + " GB/s"
    )
    return (
        f"step {metrics['step']:>{width}}/{metrics['steps']}"
        f" | loss {loss_text}{eval_text}"
        f" | lr {'n/a' if metrics['lr'] is None else format(metrics['lr'], '.3g')}"
        f" | grad norm {'nan' if grad_norm is None else f'{grad_norm:.3f}'}"
        f" | {metrics['step_time_s']:.3f} s/step"
        f" | {metrics['tokens_per_s']:,.0f} tok/s"
        f" ({metrics['tokens_per_s_per_gpu']:,.0f}/worker){efa_text}"
        f" | MFU {mfu_text}"
        f" | peak mem {metrics['peak_mem_gib']:.2f} GiB"
        + ("" if deadline_left_s is None else f" | {format_duration(deadline_left_s)} to deadline")
    )


def format_duration(seconds: float) -> str:
    """`1h02m03s`, `2m03s`, `3s`; a time past shows as 0s."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_summary(summary: RunSummary | Mapping[str, Any]) -> str:
    """The run summary as one JSON line (the driver's last but one: the closing line for people
    follows it)."""
    summary = _mapping(summary)
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise KeyError(f"summary lacks {missing}")
    return json.dumps({key: _json_number(value) for key, value in summary.items()}, separators=(",", ":"))


def parse_summary(text: str) -> dict | None:
    """The last run summary in a blob of log text, or None when there is none."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0:
            continue
        try:
            payload = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(payload, dict) and all(key in payload for key in SUMMARY_KEYS):
            return payload
    return None
