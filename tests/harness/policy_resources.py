"""Resources as the policy pack sees them (camelCase inputs, nested booleans as strings), which
several test files of tests/policy build."""

from __future__ import annotations

from types import ModuleType

from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy.rules import properties, registered, registry
from policy.rules.properties import StackResource

UNKNOWN = UNKNOWN_STRING_VALUE
LT = properties.LAUNCH_TEMPLATE
NG = properties.NODE_GROUP
EKS = properties.PULUMI_EKS_CLUSTER
AWS_EKS = properties.AWS_EKS_CLUSTER
SVC = properties.SERVICE
RAY = "kubernetes:ray.io/v1:RayCluster"
NS = properties.NAMESPACE


def efa_template(**overrides) -> dict:
    """A GPU launch template's inputs as the engine shows them (nested booleans as strings)."""
    props = {
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            "httpPutResponseHopLimit": 1,
        },
        "networkInterfaces": [
            {
                "networkCardIndex": 0,
                "deviceIndex": 0,
                "interfaceType": "efa",
                "associatePublicIpAddress": "false",
            }
        ],
    }
    props.update(overrides)
    return props


def worker_container(requests: dict | None, limits: dict | None, image: str = "repo/ray:2.58.0") -> dict:
    resources = {
        key: value for key, value in (("requests", requests), ("limits", limits)) if value is not None
    }
    return {"name": "ray-worker", "image": image, "resources": resources}


def ray_cluster(worker: dict, service_type: str = "ClusterIP", head_image: str = "repo/ray:2.58.0") -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "ray-train"},
        "spec": {
            "headGroupSpec": {
                "serviceType": service_type,
                "template": {"spec": {"containers": [{"name": "ray-head", "image": head_image}]}},
            },
            "workerGroupSpecs": [
                {"groupName": "gpu-workers", "template": {"spec": {"containers": [worker]}}}
            ],
        },
    }


GUARANTEED = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}


def gpu_group(dependencies: tuple[str, ...] = ("urn:lt-gpu",), **props) -> StackResource:
    base = {
        "labels": {"role": "gpu-worker"},
        "launchTemplate": {"id": UNKNOWN, "version": UNKNOWN},
        "subnetIds": ["a"],
    }
    return StackResource(NG, "urn:ng-gpu", {**base, **props}, dependencies)


def template(urn: str, **props) -> StackResource:
    return StackResource(LT, urn, efa_template(**props), ())


ENA_ONLY = [{"deviceIndex": 0, "associatePublicIpAddress": "false"}]


# --- one area's resource-rule cases: (rule, resource type, properties, stack, expected violation or None)


def case_ids(cases: list[tuple]) -> list[str]:
    return [f"{case[0].name}-{'fails' if case[4] else 'passes'}-{index}" for index, case in enumerate(cases)]


def check_case(rule, resource_type: str, props: dict, stack: str, expected: str | None) -> None:
    """The rule passes the properties, or reports exactly one violation that says `expected`."""
    violations = rule.check(resource_type, props, stack)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0], violations


def check_both_outcomes(area: ModuleType, cases: list[tuple]) -> None:
    """Each resource rule `area` defines has a passing and a failing case among `cases`."""
    rules = [
        rule
        for rule in registered()
        if isinstance(rule, registry.ResourceRule) and rule.check.__module__ == area.__name__
    ]
    assert rules
    for rule in rules:
        outcomes = {case[4] is None for case in cases if case[0] is rule}
        assert outcomes == {True, False}, f"{rule.name} lacks a passing or a failing case"
