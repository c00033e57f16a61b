"""The forecast in words: the strategies' table, the warning when the configured one is network-bound,
the preview's log lines, and a run's measurements beside its recorded forecast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.planner.cost import PredictedRun
from infra.planner.figures import INSTANCES, MFU_POINTS, line_rate_gbps
from infra.planner.planner import (
    GB,
    ClusterShape,
    StrategyForecast,
    Workload,
    cluster_of,
    configured_replicas,
    forecast,
    remedies,
    strategy_forecast,
    workload_of,
)
from training.config.run_config import TrainConfig


def forecast_rows(forecasts: Sequence[StrategyForecast]) -> list[dict[str, Any]]:
    return [
        {
            "name": row.name,
            "inter_node_bytes_per_step": row.inter_node_bytes_per_step,
            "step_time_s": row.step_time_s,
            "tokens_per_s": row.tokens_per_s,
            "usd_per_million_tokens": row.usd_per_million_tokens,
            "compute_s": row.compute_s,
            "communication_s": row.communication_s,
            "network_bound": row.network_bound,
        }
        for row in forecasts
    ]


def mfu_basis(strategy: StrategyForecast, gpu_name: str) -> str:
    """Where the forecast's MFU comes from: the benchmark case, and, when that ran on another GPU, that
    the forecast takes the same share of this GPU's peak (MFU_POINTS ran on synthetic tokens)."""
    measured_on = next(point.gpu_name for point in MFU_POINTS if point.label == strategy.mfu_source)
    text = f"MFU {strategy.mfu:.1%} from {strategy.mfu_source}"
    if measured_on and measured_on != gpu_name:
        text += (
            f", measured on one {measured_on} on causal rows and taken as the same share of the "
            f"{gpu_name}'s bf16 peak, not measured on it"
        )
    return text


def forecast_table(forecasts: Sequence[StrategyForecast], cluster: ClusterShape, chosen: int | None) -> str:
    lines = [
        f"forecast for {cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu_name} at {cluster.line_rate_gbps:g} Gbps "
        f"({mfu_basis(forecasts[0], cluster.gpu_name)}):",
        "  strategy     inter-node GB/step  compute s  comm s  step s  tokens/s  $/M tokens",
    ]
    for row in forecasts:
        mark = "*" if row.replicas == chosen else " "
        lines.append(
            f" {mark}{row.name:<12} {row.inter_node_bytes_per_step / GB:>18.2f} {row.compute_s:>10.3f} "
            f"{row.communication_s:>7.3f} {row.step_time_s:>7.3f} {row.tokens_per_s:>9,.0f} "
            f"{row.usd_per_million_tokens:>11.3f}"
        )
    return "\n".join(lines)


def network_warning(workload: Workload, cluster: ClusterShape, replicas: int) -> str | None:
    """What to change when the configured strategy's communication outlasts its compute."""
    current = strategy_forecast(workload, cluster, replicas)
    if not current.network_bound:
        return None
    options = "; ".join(
        f"{text} -> {option.tokens_per_s:,.0f} tokens/s"
        for text, option in remedies(workload, cluster, replicas)
    )
    return (
        f"the training job is predicted network-bound on {cluster.nodes} x {cluster.gpus_per_node} "
        f"{cluster.gpu_name}: {current.communication_s:.2f} s of communication against {current.compute_s:.2f} s "
        f"of compute per step ({current.tokens_per_s:,.0f} tokens/s with {current.name})"
        + (f"; predicted to help: {options}" if options else "")
    )


def log_forecast(
    config: TrainConfig, instance_type: str, nodes: int, network_performance: str
) -> StrategyForecast | None:
    """At preview: the forecast of the stack's job as an info line, and a warning when the configured
    strategy is network-bound. The line rate is the one AWS states for the type (`network_performance`),
    the other figures the shipped ones; nothing is said for a type or model without figures. Returns the
    configured strategy's forecast, whose predictions the stack exports beside the run's measurements."""
    import pulumi

    figures = INSTANCES.get(instance_type)
    workload = workload_of(config)
    if figures is None or workload is None:
        pulumi.log.info(
            f"no communication forecast: the planner has no figures for {instance_type} or {config.model_config}"
        )
        return None
    cluster = cluster_of(instance_type, nodes, figures, line_rate_gbps(network_performance))
    chosen = configured_replicas(config, cluster)
    forecasts = forecast(workload, cluster)
    configured = [row for row in forecasts if row.replicas == chosen]
    duration = (
        f"\n  predicted run: {config.steps} steps x {configured[0].step_time_s:.2f} s = "
        f"{config.steps * configured[0].step_time_s / 60:.1f} min with {configured[0].name}"
        if configured
        else ""
    )
    pulumi.log.info(forecast_table(forecasts, cluster, chosen) + duration)
    warning = network_warning(workload, cluster, chosen) if chosen in (1, cluster.nodes) else None
    if warning:
        pulumi.log.warn(warning)
    return configured[0] if configured else None


def measured_against_forecast(
    recorded: PredictedRun | None, summary: Mapping[str, Any] | None
) -> dict[str, Any]:
    """After a run: the planner's step time and inter-node bytes per step as recorded with the run
    (`recorded`, the TrainingRun's `planned`; None: it recorded none) beside the run's, and measured / predicted.
    The run's bytes are its summary's `efa_bytes_per_step` (sent plus received through each node's EFA
    ports, `training.metrics.efa_meter`), halved into the one direction the planner counts (FSDP's ring
    collectives send what they receive) and averaged over the nodes; None where either side has no
    value."""
    summary = summary or {}
    step_time = summary.get("step_time_s")
    per_node = [value for value in (summary.get("efa_bytes_per_step") or {}).values() if value is not None]
    measured_bytes = sum(per_node) / len(per_node) / 2 if per_node else None
    predicted_step = recorded.step_time_s if recorded else None
    predicted_bytes = recorded.bytes_per_step if recorded else None

    def ratio(measured: float | None, predicted: float | None) -> float | None:
        return round(measured / predicted, 3) if measured is not None and predicted else None

    return {
        "predictedStepTimeS": predicted_step,
        "measuredStepTimeS": step_time,
        "stepTimeRatio": ratio(step_time, predicted_step),
        "predictedBytesPerStep": predicted_bytes,
        "measuredBytesPerStep": measured_bytes,
        "bytesPerStepRatio": ratio(measured_bytes, predicted_bytes),
    }
