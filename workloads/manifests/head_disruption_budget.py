"""The Ray head's PodDisruptionBudget, and the annotation that keeps a cluster autoscaler off its node.

The head holds what a run cannot lose mid-job: Ray's GCS, the job's driver and Ray Train's
controller (the job is submitted to the head, `ray job submit`), and Ray's job history. KubeRay
runs one head pod and creates another only once it is gone, so every eviction of it costs the
run its driver.

What each protects against, and what neither does (Kubernetes docs, "Disruptions", voluntary and
involuntary disruptions; "Specifying a Disruption Budget for your Application"):

- `head_disruption_budget`, `maxUnavailable: 0` over the head pod's labels (KubeRay's, `pod_labels`):
  the eviction API refuses to evict the head (429) for as long as it is healthy. Everything that
  drains through the eviction API honours it: `kubectl drain`, and EKS draining a node of a managed
  node group in an update of its version or launch template (EKS user guide, "Managed node update
  behavior": a node whose pods do not leave within 15 minutes fails the update with
  `PodEvictionFailure`, unless the update is forced). Deleting the system node group (a new
  `systemNodeType`) drains the same way, but EKS deletes pods still there after 15 minutes
  (EKS user guide, "Delete a managed node group"), so the head then goes after that wait.
  `unhealthyPodEvictionPolicy: AlwaysAllow`: a head that is not Ready is evictable, so a drain is
  never held by a head that is broken anyway.
- `SAFE_TO_EVICT_ANNOTATION` `"false"` on the head's pod template: the Kubernetes cluster
  autoscaler does not remove a node that runs such a pod when it scales down (cluster-autoscaler
  FAQ, "What types of pods can prevent CA from removing a node?"). This stack runs no cluster
  autoscaler (both node groups have fixed sizes); the annotation keeps the head where one is added.
- Neither stops what does not ask: a node that fails or is terminated, the kubelet's own eviction
  under memory or disk pressure, a delete (`kubectl delete pod`, KubeRay's own Recreate on a spec
  change), a forced node group update. A head lost that way takes its driver with it; the
  TrainingRun then submits the job again under its run name (`job_following`).
"""

from __future__ import annotations

from platform_contract import PART_OF_LABELS
from workloads.manifests.pod_labels import head_pod_labels

# The cluster autoscaler's per-pod opt-out of scale-down (its FAQ, above).
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def head_disruption_budget(cluster_name: str, namespace: str) -> dict:
    """No voluntary eviction of the RayCluster's head pod while it is healthy (module doc)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": f"{cluster_name}-head",
            "namespace": namespace,
            "labels": dict(PART_OF_LABELS),
        },
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": head_pod_labels(cluster_name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
