"""The RayCluster's rules: Ray's ports inside the cluster, workers QoS Guaranteed (quantities read as the Kubernetes client reads them), no API token in the pods; the KubeRay operator's chart namespace-scoped (the NetworkPolicies' rules: `test_ray_network`)."""

from __future__ import annotations

import pytest
from kubernetes.utils import parse_quantity

from policy.rules import properties, ray
from tests.harness.policy_resources import (
    GUARANTEED,
    RAY,
    SVC,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
    ray_cluster,
    worker_container,
)
from workloads import manifests

RELEASE = properties.HELM_RELEASE


def kuberay_release(chart: str = "kuberay-operator", values=None) -> dict:
    """The KubeRay operator's release as the engine shows it: the program's values unless `values`."""
    return {
        "chart": chart,
        "namespace": "kuberay",
        "values": manifests.kuberay_operator_values("ray-train") if values is None else values,
    }


def tokenless(head=False, workers=False, autoscaling=False) -> dict:
    """A RayCluster whose head and worker templates set `automountServiceAccountToken` to these
    values (None: left out), with in-tree autoscaling as given."""
    cluster = ray_cluster(worker_container(GUARANTEED, GUARANTEED))
    cluster["spec"]["enableInTreeAutoscaling"] = autoscaling
    pods = [
        cluster["spec"]["headGroupSpec"]["template"]["spec"],
        cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"],
    ]
    for pod, value in zip(pods, (head, workers), strict=True):
        if value is not None:
            pod["automountServiceAccountToken"] = value
    return cluster


# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # ray-ports-not-exposed
    (
        ray.ray_ports_not_exposed,
        SVC,
        {"spec": {"type": "ClusterIP", "ports": [{"port": 8265}]}},
        "dev",
        None,
    ),
    (
        ray.ray_ports_not_exposed,
        SVC,
        {"spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}},
        "dev",
        None,
    ),
    (ray.ray_ports_not_exposed, SVC, {"spec": {"ports": [{"port": 6379}]}}, "dev", None),
    (ray.ray_ports_not_exposed, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    # Numbers reach policies as floats (JSON through protobuf).
    (
        ray.ray_ports_not_exposed,
        SVC,
        {"spec": {"type": "LoadBalancer", "ports": [{"port": 8265.0}]}},
        "dev",
        "Ray port(s) 8265 outside",
    ),
    (
        ray.ray_ports_not_exposed,
        SVC,
        {
            "spec": {
                "type": "NodePort",
                "ports": [{"port": 80, "targetPort": "dashboard"}, {"port": 1, "targetPort": "10001"}],
            }
        },
        "dev",
        "Ray port(s) 10001, dashboard",
    ),
    (
        ray.ray_ports_not_exposed,
        RAY,
        ray_cluster(worker_container(GUARANTEED, GUARANTEED), "LoadBalancer"),
        "dev",
        "headGroupSpec.serviceType is LoadBalancer",
    ),
    (
        ray.ray_ports_not_exposed,
        "kubernetes:ray.io/v1:RayJob",
        {"spec": {"rayClusterSpec": {"headGroupSpec": {"headService": {"spec": {"type": "NodePort"}}}}}},
        "dev",
        "headService.spec.type is NodePort",
    ),
    # ray-worker-requests-equal-limits
    (ray.ray_workers_guaranteed, RAY, ray_cluster(worker_container(GUARANTEED, GUARANTEED)), "dev", None),
    (ray.ray_workers_guaranteed, RAY, ray_cluster(worker_container(None, GUARANTEED)), "dev", None),
    (
        ray.ray_workers_guaranteed,
        RAY,
        ray_cluster(
            worker_container({"cpu": 40, "memory": "163840Mi"}, {"cpu": "40000m", "memory": "160Gi"})
        ),
        "dev",
        None,
    ),
    (
        ray.ray_workers_guaranteed,
        RAY,
        ray_cluster(worker_container({**GUARANTEED, "cpu": UNKNOWN}, GUARANTEED)),
        "dev",
        None,
    ),
    (
        ray.ray_workers_guaranteed,
        RAY,
        ray_cluster(worker_container({**GUARANTEED, "cpu": "36"}, GUARANTEED)),
        "dev",
        "worker group gpu-workers, container ray-worker: cpu request 36 != limit 40",
    ),
    (
        ray.ray_workers_guaranteed,
        RAY,
        ray_cluster(
            worker_container(GUARANTEED, {k: v for k, v in GUARANTEED.items() if k != "nvidia.com/gpu"})
        ),
        "dev",
        "nvidia.com/gpu requested (4) without a limit",
    ),
    (
        ray.ray_workers_guaranteed,
        RAY,
        ray_cluster(worker_container(GUARANTEED, None)),
        "dev",
        "no cpu limit",
    ),
    # kuberay-operator-namespace-scoped
    (ray.kuberay_operator_namespace_scoped, RELEASE, kuberay_release(), "dev", None),
    (
        ray.kuberay_operator_namespace_scoped,
        "kubernetes:helm.sh/v4:Chart",
        kuberay_release(chart="oci://ghcr.io/ray-project/kuberay-operator"),
        "dev",
        None,
    ),
    (ray.kuberay_operator_namespace_scoped, RELEASE, kuberay_release(values=UNKNOWN), "dev", None),
    (
        ray.kuberay_operator_namespace_scoped,
        RELEASE,
        kuberay_release(values={"singleNamespaceInstall": UNKNOWN}),
        "dev",
        None,
    ),
    # another chart, or no chart of Helm's
    (
        ray.kuberay_operator_namespace_scoped,
        RELEASE,
        kuberay_release(chart="nvidia-device-plugin", values={}),
        "dev",
        None,
    ),
    (ray.kuberay_operator_namespace_scoped, RAY, {"chart": "kuberay-operator"}, "dev", None),
    (
        ray.kuberay_operator_namespace_scoped,
        RELEASE,
        kuberay_release(values={"nodeSelector": {"role": "system"}}),
        "dev",
        "values.singleNamespaceInstall is not set: set it true",
    ),
    (
        ray.kuberay_operator_namespace_scoped,
        RELEASE,
        kuberay_release(chart="kuberay/kuberay-operator", values={"singleNamespaceInstall": False}),
        "dev",
        "values.singleNamespaceInstall is False",
    ),
    (
        ray.kuberay_operator_namespace_scoped,
        "kubernetes:helm.sh/v4:Chart",
        kuberay_release(values={"singleNamespaceInstall": "false"}),
        "dev",
        "instead of a ClusterRole",
    ),
    # ray-pods-without-api-token
    (ray.ray_pods_without_api_token, RAY, tokenless(), "dev", None),
    (ray.ray_pods_without_api_token, RAY, tokenless(head="false", workers="false"), "dev", None),
    (ray.ray_pods_without_api_token, RAY, tokenless(workers=UNKNOWN), "dev", None),
    (ray.ray_pods_without_api_token, RAY, tokenless(head=None, autoscaling=True), "dev", None),
    (ray.ray_pods_without_api_token, RAY, tokenless(head=None, autoscaling=UNKNOWN), "dev", None),
    (ray.ray_pods_without_api_token, SVC, {"spec": {"automountServiceAccountToken": True}}, "dev", None),
    (
        ray.ray_pods_without_api_token,
        RAY,
        tokenless(head=None),
        "dev",
        "the head's pod template does not set automountServiceAccountToken: false",
    ),
    (
        ray.ray_pods_without_api_token,
        RAY,
        tokenless(workers=True, autoscaling=True),
        "dev",
        "worker group gpu-workers's pod template does not set automountServiceAccountToken: false",
    ),
    (
        ray.ray_pods_without_api_token,
        "kubernetes:ray.io/v1:RayJob",
        {"spec": {"rayClusterSpec": tokenless(head=True)["spec"]}},
        "dev",
        "the head's pod template",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(ray, CASES)


@pytest.mark.parametrize(
    "text",
    ["40", "1Gi", "1024Mi", "160Gi", "100m", "1.5", "0.5Gi", "2k", "3M", "1e3", "1Ei", "7n", "40 ", "+2"],
)
def test_pack_reads_quantities_as_the_kubernetes_client_does(text):
    """The pack's own parser (its virtualenv has no kubernetes client) against `parse_quantity`."""
    assert ray._quantity(text) == parse_quantity(text)
