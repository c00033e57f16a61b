"""Files a finished run leaves in its folder: summary.json and a picture of the run; and the line
for people that ends the run's output, after the JSON summary for scripts."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from training.metrics.report import format_duration

SUMMARY_FILE = "summary.json"
PICTURE_FILE = "run.png"


def render_picture(summary: dict[str, Any], history: list[dict[str, Any]]) -> bytes | None:
    """Loss (and held-out loss) and tokens/s per step as a PNG; None (with a note) when matplotlib
    is missing. Histories of runs from before the held-out loss hold no `eval_loss`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        print("matplotlib is not installed: no run picture", file=sys.stderr)
        return None

    steps = [entry["step"] for entry in history]
    figure, (loss_axes, rate_axes) = pyplot.subplots(1, 2, figsize=(11, 4))
    loss_axes.plot(
        steps, [entry["loss"] for entry in history], marker=".", color="tab:blue", label="training"
    )
    evaluated = [entry for entry in history if entry.get("eval_loss") is not None]
    if evaluated:
        loss_axes.plot(
            [entry["step"] for entry in evaluated],
            [entry["eval_loss"] for entry in evaluated],
            marker="o",
            color="tab:orange",
            label="held-out (--eval-data)",
        )
        loss_axes.legend()
    loss_axes.set(xlabel="step", ylabel="loss", title="loss")
    loss_axes.grid(alpha=0.3)
    rate_axes.plot(steps, [entry["tokens_per_s"] for entry in history], marker=".", color="tab:green")
    rate_axes.set(xlabel="step", ylabel="tokens/s (all workers)", title="throughput")
    rate_axes.set_ylim(bottom=0)
    rate_axes.grid(alpha=0.3)
    device = summary.get("gpu_name") or summary.get("device", "cpu")
    mfu = summary.get("mfu")
    mfu_text = f", MFU {100 * mfu:.1f}%" if mfu is not None else ""
    figure.suptitle(
        f"{summary.get('model')} on {summary['world_size']} x {device}: "
        f"seq {summary.get('seq_len')} x batch {summary.get('batch_size')}{mfu_text}"
    )
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot.close(figure)
    return buffer.getvalue()


def write_run_files(
    write: Callable[[str, bytes], object],
    run_dir: str,
    summary: dict[str, Any],
    history: list[dict[str, Any]],
) -> dict[str, Any]:
    """Write summary.json (and run.png) through `write(name, data)`; returns the completed summary."""
    summary = {**summary, "run_dir": run_dir, "summary_path": f"{run_dir.rstrip('/')}/{SUMMARY_FILE}"}
    picture = render_picture(summary, history) if history else None
    if picture is not None:
        write(PICTURE_FILE, picture)
    write(SUMMARY_FILE, json.dumps({**summary, "history": history}, indent=2).encode())
    return summary


def closing_line(summary: Mapping[str, Any]) -> str:
    """The run in one line for people, printed after the JSON summary (which log parsers read:
    `training.metrics.report.parse_summary`; this line holds no JSON): the loss first -> last, the
    time, the run folder and what it holds, and how to resume. It reads the keys every summary
    holds (`SUMMARY_KEYS`), and the run name where there is one (else the run folder's name)."""

    def loss(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    run_dir = summary.get("run_dir")
    run_name = summary.get("run_name") or (run_dir.rstrip("/").rsplit("/", 1)[-1] if run_dir else None)
    first, last = loss(summary.get("loss_first")), loss(summary.get("loss_last"))
    steps = f" ({summary['steps_run']} steps)" if "steps_run" in summary else ""
    line = f"done: loss {first} -> {last} in {format_duration(summary['duration_s'])}{steps}"
    if run_dir:
        line += (
            f"; the run folder {run_dir} holds {PICTURE_FILE}, the TensorBoard events (tensorboard/) "
            "and the checkpoints"
        )
    if run_name:
        line += f"; the same command with --run-name {run_name} resumes from its latest checkpoint"
    return line
