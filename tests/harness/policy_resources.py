"""Resources as the policy pack sees them (camelCase inputs, nested booleans as strings), which
several test files of tests/policy build."""

from __future__ import annotations

from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

from policy.rules import properties
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
