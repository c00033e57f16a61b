"""The planner against published figures and measurements: the table docs/benchmarks.md shows (a test
keeps it equal to `comparison_table()`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from infra.planner.figures import (
    AWS_SAMPLE_BATCH,
    AWS_SAMPLE_EFA_STEPS_PER_S,
    AWS_SAMPLE_INSTANCE,
    AWS_SAMPLE_NODES,
    AWS_SAMPLE_SEQ_LEN,
    AWS_SAMPLE_TCP_STEPS_PER_S,
    H200_THROUGHPUT,
    INSTANCES,
    NCCL_TESTS,
)
from infra.planner.planner import (
    GB,
    PARAM_BYTES,
    ClusterShape,
    StrategyForecast,
    Workload,
    cluster_of,
    ring_share,
    strategy_forecast,
)
from training.config.run_config import load_model_config
from training.metrics.flops import flops_per_token, num_params

QWEN = "qwen2.5-1.5b"


def _qwen_workload(seq_len: int, batch_size: int, **changes: Any) -> Workload:
    model = load_model_config(QWEN)
    base = Workload(
        params=num_params(model),
        flops_per_token=flops_per_token(model, seq_len),
        layers=int(model["num_hidden_layers"]),
        seq_len=seq_len,
        batch_size=batch_size,
        grad_accum_steps=1,
        defer_grad_sync=False,
        reshard_after_forward=True,
        activation_checkpointing=False,
    )
    return dataclasses.replace(base, **changes)


def all_reduce_seconds(size_bytes: int, cluster: ClusterShape) -> float:
    """A ring all-reduce over every rank: 2(N-1)/N of the buffer through the slowest link."""
    line = cluster.line_rate_gbps * GB / 8
    intra = cluster.intra_node_gbytes_per_s * GB
    return 2 * ring_share(cluster.ranks) * size_bytes / (min(line, intra) if cluster.nodes > 1 else intra)


def aws_sample_forecast(line_rate: float | None = None) -> StrategyForecast:
    """AWS's sample job: bf16 weights without mixed precision, so gradients reduce in bf16."""
    cluster = cluster_of(AWS_SAMPLE_INSTANCE, AWS_SAMPLE_NODES, INSTANCES[AWS_SAMPLE_INSTANCE], line_rate)
    workload = _qwen_workload(AWS_SAMPLE_SEQ_LEN, AWS_SAMPLE_BATCH, reduce_bytes=PARAM_BYTES)
    return strategy_forecast(workload, cluster, 1)


def implied_line_rate(steps_per_s: float) -> float:
    """The line rate at which the planner reproduces the sample's steps/s (bisection; the forecast
    rate rises with the line rate)."""
    low, high = 0.01, 10_000.0
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (
            (middle, high) if 1 / aws_sample_forecast(middle).step_time_s < steps_per_s else (low, middle)
        )
    return low


def comparison_rows() -> list[list[str]]:
    """What the planner predicts against each measurement or published figure, with its error."""
    rows = []
    h200 = ClusterShape(1, 1, "NVIDIA H200", 0.0, 1.0, 0.0)
    for measured_case in H200_THROUGHPUT:
        workload = _qwen_workload(
            4096,
            measured_case.batch_size,
            grad_accum_steps=measured_case.grad_accum_steps,
            defer_grad_sync=measured_case.defer_grad_sync,
        )
        predicted = strategy_forecast(workload, h200, 1)
        calibration = " (the MFU point)" if predicted.mfu_source.endswith(f" {measured_case.case}") else ""
        measured = measured_case.tokens_per_s.value
        rows.append(
            [
                f"compute: 1 x H200, `{measured_case.case}`{calibration}",
                "tokens/s",
                f"{measured:,.0f}",
                f"{predicted.tokens_per_s:,.0f}",
                f"{predicted.tokens_per_s / measured - 1:+.1%}",
            ]
        )
    efa = aws_sample_forecast()
    line_rate = INSTANCES[AWS_SAMPLE_INSTANCE].line_rate_gbps.value
    for label, figure in (("EFA", AWS_SAMPLE_EFA_STEPS_PER_S), ("TCP", AWS_SAMPLE_TCP_STEPS_PER_S)):
        predicted_rate = 1 / efa.step_time_s
        rows.append(
            [
                f"network: AWS's sample over {label}, 2 x g6.12xlarge, seq 128 x 1, FSDP "
                f"(at the {line_rate:g} Gbps line rate; {implied_line_rate(figure.value):.1f} Gbps reproduces it)",
                "steps/s",
                f"{figure.value:.4f}",
                f"{predicted_rate:.4f}",
                f"{predicted_rate / figure.value - 1:+.1%}",
            ]
        )
    for published in NCCL_TESTS:
        figures = INSTANCES[published.instance_type]
        cluster = cluster_of(published.instance_type, published.nodes, figures)
        seconds = all_reduce_seconds(published.size_bytes, cluster)
        rows.append(
            [
                f"network: nccl-tests all_reduce_perf, {published.nodes} x {published.instance_type}, "
                f"{published.size_bytes / 2**30:g} GiB fp32",
                "time (us)",
                f"{published.time_us.value:,.0f}",
                f"{seconds * 1e6:,.0f}",
                f"{seconds * 1e6 / published.time_us.value - 1:+.1%}",
            ]
        )
    return rows


def comparison_table() -> str:
    header = ["figure", "unit", "measured", "planner", "error"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in comparison_rows())])
