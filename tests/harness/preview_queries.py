"""Questions the tests of the whole program ask of its plan, and the names they ask them by.

Shared by tests/test_program.py and the component tests that run the program
(tests/infra/resources/, tests/workloads/, tests/infra/preflight/test_window.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pulumi
from pulumi.runtime.sync_await import _sync_await

from tests.harness.program import Preview, Registration

TRAINING_RUN = "pulumi-python:dynamic/workloads:TrainingRun"
RESERVATION = "cr-0123456789abcdef0"
# The time of every preview about reservation dates.
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
GPU_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
# What makes pulumi-kubernetes replace (delete, then create) an object rather than patch it: its
# identity (provider/pkg/provider/provider.go, `Diff`: apiVersion/kind or metadata name/namespace).
# A replaced CRD deletes every object of its kind, so every RayCluster with it.
OBJECT_IDENTITY = ("apiVersion", "kind", "metadata.name", "metadata.namespace")


def subnet_with_id(plan: Preview, subnet_id: str):
    """The subnet registration behind an id (the mocks give each resource the id `<name>-id`)."""
    return next(r for r in plan.of_type("aws:ec2/subnet:Subnet") if f"{r.name}-id" == subnet_id)


def gpu_group(plan: Preview):
    return next(
        r
        for r in plan.of_type("aws:eks/nodeGroup:NodeGroup")
        if r.inputs["labels"].get("role") == "gpu-worker"
    )


def field_at(inputs: dict, path: str):
    for key in path.split("."):
        inputs = inputs.get(key, {}) if isinstance(inputs, dict) else {}
    return inputs


def engine_step(before: Registration | None, after: Registration, identity: tuple[str, ...]) -> str:
    """What `pulumi up` does with a registration given the state of the earlier deploy: create,
    same (inputs unchanged), update (patched in place) or replace (an identity field changed)."""
    if before is None:
        return "create"
    if before.inputs == after.inputs:
        return "same"
    changed = [key for key in identity if field_at(before.inputs, key) != field_at(after.inputs, key)]
    return "replace" if changed else "update"


# What a finished TrainingRun's create returns beside its inputs (`RunOutputs`): two GPU nodes launched
# 2 h and 1 h 30 min before the output's time (3.5 node hours), the summary; with
# `gpuNodesAfterTraining: keep` no release. A later `pulumi up` of an unchanged run reads them back.
RUN_OUTPUTS = {
    "status": "SUCCEEDED",
    "gpu_nodes": {
        "node-a": {"instanceId": "i-0a1b2c3d4e5f60001", "launchTime": "2026-12-05T07:00:00+00:00"},
        "node-b": {"instanceId": "i-0a1b2c3d4e5f60002", "launchTime": "2026-12-05T07:30:00+00:00"},
    },
    "finished_at": "2026-12-05T09:00:00+00:00",
    "summary": {
        "tokens_seen": 1_000_000,
        "step_time_s": 3.0,
        "efa_bytes_per_step": {"pod-a": 4e9, "pod-b": 4e9},
    },
}


def resolved(output: pulumi.Output) -> Any:
    """An output's value once the program's run settled (`pulumi up`: known)."""
    return _sync_await(output.future())
