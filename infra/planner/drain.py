"""The drain's checkpoint at preview: how long a node's share of the checkpoint takes to reach S3, the
worker pods' grace that holds it, or a refusal naming the key when no grace EKS honours can.

The arithmetic is the job's own (`training.config.drain_budget`); the model's size is the planner's
(`workload_of`), the step time its prediction for the configured strategy.
"""

from __future__ import annotations

import pulumi

from infra.config.parsing import ConfigError
from infra.planner.planner import StrategyForecast, workload_of
from training.config.drain_budget import MAX_GRACE_S, STREAM_BYTES_PER_S, DrainBudget, drain_budget
from training.config.run_config import TrainConfig

# The step time assumed where the planner has none for the instance type or the model: slow, so the
# grace errs long.
UNPLANNED_STEP_S = 30.0
GB = 1e9


def drain_line(budget: DrainBudget, model: str) -> str:
    return (
        f"drain: a node's checkpoint of {model} is {budget.bytes_per_node / GB:.1f} GB, "
        f"{budget.ranks_per_node} ranks writing it to S3 at {STREAM_BYTES_PER_S / 1e6:.0f} MB/s each: "
        f"about {budget.write_s:.0f} s; with a write in flight when the notice comes, {budget.worst_s:.0f} s; "
        f"worker pods get terminationGracePeriodSeconds {budget.grace_s} (Ray's drain {budget.drain_timeout_s} s)"
    )


def size_the_drain(
    config: TrainConfig, predicted: StrategyForecast | None, nodes: int, ranks_per_node: int
) -> DrainBudget:
    """The worker pods' drain for this run, said in one line; refused (naming `gpuNodeCount`, which
    sets a node's share) when its grace exceeds what EKS waits for a node's drain."""
    workload = workload_of(config)
    parameters = workload.params if workload else 0
    step_s = predicted.step_time_s if predicted else UNPLANNED_STEP_S
    budget = drain_budget(parameters, nodes, ranks_per_node, step_s)
    if not budget.fits:
        raise ConfigError(
            f"config key 'gpuNodeCount' = {nodes}: a drain's checkpoint of {config.model_config} on each node "
            f"({budget.bytes_per_node / GB:.1f} GB, about {budget.worst_s:.0f} s with a write in flight) needs a "
            f"grace of {budget.grace_s} s, more than the {MAX_GRACE_S} s EKS waits for a node's drain before it "
            "terminates the instance: use more GPU nodes (a smaller share each) or a smaller model (training.preset)"
        )
    pulumi.log.info(drain_line(budget, config.model_config))
    return budget
