"""The Ray head's NetworkPolicy, judged by a model of how Kubernetes admits a connection."""

from __future__ import annotations

import kubernetes_validate
import pytest

from platform_contract import RAY_PORTS
from tests.harness.manifest_checks import KUBERNETES_VERSION
from workloads import manifests


def admits(policy: dict, policy_namespace: str, pod_labels: dict, source_namespace: str, port: int) -> bool:
    """Whether a NetworkPolicy lets a pod of `source_namespace` open `port` on a pod with `pod_labels`.

    Models the Kubernetes NetworkPolicy rules for ingress (networking.k8s.io/v1), as far as this
    program's policy uses them: a pod the policy selects is isolated for ingress, and a connection is
    admitted when one rule's `from` peers (missing: anyone) and `ports` (missing: all) both match; a
    peer with a `podSelector` and no `namespaceSelector` matches pods of the policy's own namespace.
    """
    selected = policy["spec"]["podSelector"].get("matchLabels", {}).items() <= pod_labels.items()
    if not selected or "Ingress" not in policy["spec"]["policyTypes"]:
        return True
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        from_ok = peers is None or any(
            "namespaceSelector" not in peer and source_namespace == policy_namespace for peer in peers
        )
        ports = rule.get("ports")
        port_ok = ports is None or any(p.get("port") == port for p in ports)
        if from_ok and port_ok:
            return True
    return False


def test_ray_head_ports_are_closed_to_other_namespaces():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    head = manifests.head_pod_labels("ray-train")
    assert manifests.head_pod_selector("ray-train") == "ray.io/cluster=ray-train,ray.io/node-type=head"
    for port in RAY_PORTS.values():
        assert not admits(policy, "ray-train", head, "default", port)
        assert not admits(policy, "ray-train", head, manifests.KUBERAY_OPERATOR.namespace, port)
        assert admits(policy, "ray-train", head, "ray-train", port)
    # Workers reach the head on Ray's other ports too (object manager, raylet, worker ports).
    assert admits(policy, "ray-train", head, "ray-train", 12345)
    # Workers are not selected: the policy leaves them as they were.
    worker = {manifests.RAY_CLUSTER_LABEL: "ray-train", manifests.RAY_NODE_TYPE_LABEL: "worker"}
    assert admits(policy, "ray-train", worker, "default", RAY_PORTS["dashboard"])


def test_policy_model_catches_an_open_rule():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    policy["spec"]["ingress"] = [{}]
    assert admits(policy, "ray-train", manifests.head_pod_labels("ray-train"), "default", 8265)


def test_network_policy_schema_check_catches_a_bad_field():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    policy["spec"]["podSelectors"] = policy["spec"].pop("podSelector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
