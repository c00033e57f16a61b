"""The labels KubeRay puts on a RayCluster's pods, and the selectors built on them."""

from __future__ import annotations

# Labels KubeRay puts on every pod of a RayCluster (its utils.RayClusterLabelKey, RayNodeTypeLabelKey).
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"


def ray_cluster_pod_labels(cluster_name: str) -> dict[str, str]:
    """The label KubeRay puts on every pod of the RayCluster, head and workers."""
    return {RAY_CLUSTER_LABEL: cluster_name}


def head_pod_labels(cluster_name: str) -> dict[str, str]:
    """Labels KubeRay puts on the head pod."""
    return {**ray_cluster_pod_labels(cluster_name), RAY_NODE_TYPE_LABEL: "head"}


def head_pod_selector(cluster_name: str) -> str:
    """Label selector of the head pod."""
    return ",".join(f"{key}={value}" for key, value in head_pod_labels(cluster_name).items())


def worker_pod_selector(cluster_name: str) -> str:
    return f"{RAY_CLUSTER_LABEL}={cluster_name},{RAY_NODE_TYPE_LABEL}=worker"
