"""The Ray head's PodDisruptionBudget against the Kubernetes schemas: it selects the head pod alone,
as KubeRay labels it, and lets no voluntary eviction take it while it is healthy; the head's pod
template keeps a cluster autoscaler off its node, the workers' does not."""

from __future__ import annotations

import kubernetes_validate

from infra.aws_rules.sizing import WorkerSizing
from infra.config.stack import DEFAULT_IMAGE
from tests.harness.fake_kube_api import pod, selected
from tests.harness.manifest_checks import CODE, KUBERNETES_VERSION
from workloads import manifests
from workloads.manifests.head_disruption_budget import SAFE_TO_EVICT_ANNOTATION, head_disruption_budget


def test_the_budget_matches_the_kubernetes_schema():
    kubernetes_validate.validate(
        head_disruption_budget("ray-train", "ray-train"), KUBERNETES_VERSION, strict=True
    )


def test_the_budget_holds_the_head_pod_alone_and_lets_none_of_it_go():
    budget = head_disruption_budget("ray-train", "ray-train")
    assert budget["metadata"] == {
        "name": "ray-train-head",
        "namespace": "ray-train",
        "labels": {"app.kubernetes.io/part-of": "eks-ray-train"},
    }
    assert budget["spec"]["maxUnavailable"] == 0
    # A head that is not Ready protects nothing: a drain is not held by it.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    labels = budget["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{key}={value}" for key, value in labels.items())
    # The pods as KubeRay labels them (`fake_kube_api.pod`, the fakes' one Ray pod builder).
    assert selected(pod("ray-train-head-9bq5w", "head")["metadata"]["labels"], selector)
    assert not selected(pod("ray-train-gpu-workers-worker-7xk2p", "worker")["metadata"]["labels"], selector)
    assert not selected(manifests.head_pod_labels("another-cluster"), selector)


def test_only_the_head_pod_template_keeps_a_cluster_autoscaler_off_its_node():
    spec = manifests.RayClusterSpec(
        name="ray-train",
        namespace="ray-train",
        image=DEFAULT_IMAGE,
        ray_version="2.58.0",
        region="us-east-2",
        worker_replicas=2,
        worker=WorkerSizing(4, 1, 40, "160Gi", 46_000, 190_000),
        service_account="ray-train",
        code_configmap="training-code",
        code_files=CODE,
    )
    cluster = manifests.ray_cluster(spec)
    head = cluster["spec"]["headGroupSpec"]["template"]["metadata"]["annotations"]
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert head[SAFE_TO_EVICT_ANNOTATION] == "false"
    assert SAFE_TO_EVICT_ANNOTATION not in group["template"]["metadata"]["annotations"]
    assert SAFE_TO_EVICT_ANNOTATION == "cluster-autoscaler.kubernetes.io/safe-to-evict"
