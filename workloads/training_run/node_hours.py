"""The GPU nodes' EC2 launch times, which the run's cost counts node hours from.

Every GPU node the run saw (each readiness poll, after each job and at the end: an instance
replaced during the run, or one that never became Ready, counts too) is named with its EC2
instance (`ec2_instances.instance_record`). A node without an instance id, or EC2 refusing
DescribeInstances, makes them unavailable with the reason, not the run a failure; an instance EC2
does not list is named in its record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from workloads.training_run.access.cluster_api import NodeFacts
from workloads.training_run.access.ec2_instances import (
    LaunchTimes,
    LaunchTimesUnavailable,
    instance_id,
    instance_record,
)


@dataclass(frozen=True)
class GpuNodeLaunches:
    """Every GPU node the run saw, each with its EC2 instance (`ec2_instances.instance_record`), or
    why they are unavailable; `at` is when this was read, the output's time (ISO 8601, UTC)."""

    nodes: dict[str, dict[str, str]] | None
    unavailable: str | None
    at: str


def launches(
    gpu_nodes: Iterable[NodeFacts], launch_times: LaunchTimes
) -> tuple[dict[str, dict[str, str]] | None, str | None]:
    """Each GPU node seen, by name, with its instance's record; or None and why they are unavailable."""
    seen = sorted(gpu_nodes, key=lambda node: (node.name, node.provider_id))
    if not seen:
        return None, "the run found no GPU node"
    missing = sorted(node.name for node in seen if instance_id(node.provider_id) is None)
    if missing:
        return None, f"node(s) {', '.join(missing)} carry no EC2 instance id in spec.providerID"
    instances: dict[str, str] = {}
    for node in seen:  # a name a later instance took again is told apart by its instance
        found = instance_id(node.provider_id) or ""
        instances[node.name if node.name not in instances else f"{node.name} ({found})"] = found
    try:
        lives = launch_times(sorted(set(instances.values())))
    except LaunchTimesUnavailable as error:
        return None, str(error)
    return {name: instance_record(found, lives.get(found)) for name, found in instances.items()}, None
