"""The plan in words: the strategies' table, the warning when the configured one is network-bound,
the preview's log lines, and a run's measured figures beside the plan's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.plan.cost import PlannedRun
from infra.plan.figures import INSTANCES, MFU_POINTS, line_rate_gbps
from infra.plan.planner import (
    GB,
    ClusterShape,
    StrategyPlan,
    Workload,
    cluster_of,
    configured_replicas,
    plan,
    remedies,
    strategy_plan,
    workload_of,
)
from training.config.run_config import TrainConfig


def plan_rows(plans: Sequence[StrategyPlan]) -> list[dict[str, Any]]:
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
        for row in plans
    ]


def mfu_basis(plan: StrategyPlan, gpu_name: str) -> str:
    """Where the plan's MFU comes from: the benchmark case, and, when that ran on another GPU, that
    the plan takes the same share of this GPU's peak (MFU_POINTS ran on synthetic tokens)."""
    measured_on = next(point.gpu_name for point in MFU_POINTS if point.label == plan.mfu_source)
    text = f"MFU {plan.mfu:.1%} from {plan.mfu_source}"
    if measured_on and measured_on != gpu_name:
        text += (
            f", measured on one {measured_on} on causal rows and taken as the same share of the "
            f"{gpu_name}'s bf16 peak, not measured on it"
        )
    return text


def plan_table(plans: Sequence[StrategyPlan], cluster: ClusterShape, chosen: int | None) -> str:
    lines = [
        f"plan for {cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu_name} at {cluster.line_rate_gbps:g} Gbps "
        f"({mfu_basis(plans[0], cluster.gpu_name)}):",
        "  strategy     inter-node GB/step  compute s  comm s  step s  tokens/s  $/M tokens",
    ]
    for row in plans:
        mark = "*" if row.replicas == chosen else " "
        lines.append(
            f" {mark}{row.name:<12} {row.inter_node_bytes_per_step / GB:>18.2f} {row.compute_s:>10.3f} "
            f"{row.communication_s:>7.3f} {row.step_time_s:>7.3f} {row.tokens_per_s:>9,.0f} "
            f"{row.usd_per_million_tokens:>11.3f}"
        )
    return "\n".join(lines)


def network_warning(workload: Workload, cluster: ClusterShape, replicas: int) -> str | None:
    """What to change when the configured strategy's communication outlasts its compute."""
    current = strategy_plan(workload, cluster, replicas)
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


def log_plan(
    config: TrainConfig, instance_type: str, nodes: int, network_performance: str
) -> StrategyPlan | None:
    """At preview: the plan of the stack's job as an info line, and a warning when the configured
    strategy is network-bound. The line rate is the one AWS states for the type (`network_performance`),
    the other figures the shipped ones; nothing is said for a type or model without figures. Returns the
    configured strategy's plan, whose predictions the stack exports beside the measured figures."""
    import pulumi

    figures = INSTANCES.get(instance_type)
    workload = workload_of(config)
    if figures is None or workload is None:
        pulumi.log.info(
            f"no communication plan: the planner has no figures for {instance_type} or {config.model_config}"
        )
        return None
    cluster = cluster_of(instance_type, nodes, figures, line_rate_gbps(network_performance))
    chosen = configured_replicas(config, cluster)
    plans = plan(workload, cluster)
    configured = [row for row in plans if row.replicas == chosen]
    duration = (
        f"\n  predicted run: {config.steps} steps x {configured[0].step_time_s:.2f} s = "
        f"{config.steps * configured[0].step_time_s / 60:.1f} min with {configured[0].name}"
        if configured
        else ""
    )
    pulumi.log.info(plan_table(plans, cluster, chosen) + duration)
    warning = network_warning(workload, cluster, chosen) if chosen in (1, cluster.nodes) else None
    if warning:
        pulumi.log.warn(warning)
    return configured[0] if configured else None


def measured_against_plan(planned: PlannedRun | None, summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """After a run: the planner's step time and inter-node bytes per step as recorded with the run
    (`planned`, the TrainingRun's; None: it recorded none) beside the run's, and measured / predicted.
    The run's bytes are its summary's `efa_bytes_per_step` (sent plus received through each node's EFA
    ports, `training.metrics.efa_meter`), halved into the one direction the planner counts (FSDP's ring
    collectives send what they receive) and averaged over the nodes; None where either side has no
    figure."""
    summary = summary or {}
    step_time = summary.get("step_time_s")
    per_node = [value for value in (summary.get("efa_bytes_per_step") or {}).values() if value is not None]
    measured_bytes = sum(per_node) / len(per_node) / 2 if per_node else None
    predicted_step = planned.step_time_s if planned else None
    predicted_bytes = planned.bytes_per_step if planned else None

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
