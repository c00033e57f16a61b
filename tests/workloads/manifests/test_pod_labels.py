"""`workloads/manifests/pod_labels.py`: the selectors pick the pods KubeRay labels, as the API server
matches an equality selector (the NetworkPolicies built on the labels: test_network_policy.py)."""

from __future__ import annotations

from tests.harness.fake_kube_api import selected
from workloads.manifests.pod_labels import (
    RAY_CLUSTER_LABEL,
    RAY_NODE_TYPE_LABEL,
    head_pod_labels,
    head_pod_selector,
    ray_cluster_pod_labels,
    worker_pod_selector,
)

# What KubeRay puts on a worker pod of the RayCluster (utils.RayClusterLabelKey, RayNodeTypeLabelKey).
WORKER = {RAY_CLUSTER_LABEL: "ray-train", RAY_NODE_TYPE_LABEL: "worker"}


def test_the_head_selector_picks_the_head_and_no_worker():
    head = head_pod_labels("ray-train")
    assert selected(head, head_pod_selector("ray-train"))
    assert not selected(WORKER, head_pod_selector("ray-train"))


def test_the_worker_selector_picks_the_workers_and_not_the_head():
    assert selected(WORKER, worker_pod_selector("ray-train"))
    assert not selected(head_pod_labels("ray-train"), worker_pod_selector("ray-train"))


def test_no_selector_picks_another_clusters_pods():
    other = {**WORKER, RAY_CLUSTER_LABEL: "other"}
    assert not selected(other, worker_pod_selector("ray-train"))
    assert not selected(head_pod_labels("other"), head_pod_selector("ray-train"))


def test_every_pod_of_the_cluster_carries_the_cluster_label():
    cluster = ray_cluster_pod_labels("ray-train")
    assert cluster.items() <= head_pod_labels("ray-train").items()
    assert cluster.items() <= WORKER.items()
