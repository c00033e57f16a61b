"""The Ray head's NetworkPolicy: connections from its own namespace only."""

from __future__ import annotations

from platform_contract import (
    PART_OF_LABELS,
)
from workloads.manifests.pod_labels import head_pod_labels


def head_network_policy(cluster_name: str, namespace_name: str) -> dict:
    """The Ray head admits connections from pods of its own namespace only.

    Its GCS, dashboard/Jobs API and client ports (`RAY_PORTS`) take jobs from whoever holds the
    cluster's Ray token (`raycluster.RAY_AUTH_OPTIONS`). Every port stays open to the namespace,
    since workers reach the head on many more (object and node managers, worker ports, the
    dashboard agent). Nothing outside it needs the head:
    - the KubeRay operator (namespace `kuberay`) queries the dashboard only for RayJobs and
      RayServices, never for a plain RayCluster (kuberay v1.7.0, ray-operator/controllers/ray);
    - kubelet probes come from the node, which the VPC CNI's policy agent always admits;
    - the training run reaches the head by `kubectl exec` (API server to kubelet), which network
      policies do not see, as does `kubectl port-forward` to the dashboard.
    """
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{cluster_name}-head",
            "namespace": namespace_name,
            "labels": dict(PART_OF_LABELS),
        },
        "spec": {
            "podSelector": {"matchLabels": head_pod_labels(cluster_name)},
            "policyTypes": ["Ingress"],
            # An empty pod selector without a namespace selector: every pod of this namespace.
            "ingress": [{"from": [{"podSelector": {}}]}],
        },
    }
