"""The KubeRay operator's namespace: the release's own, declared with `restricted` enforced, warned and audited."""

from __future__ import annotations

from workloads import manifests


def test_the_operators_namespace_enforces_restricted():
    namespace = manifests.kuberay_namespace()
    assert namespace["metadata"]["name"] == manifests.KUBERAY_OPERATOR.namespace == "kuberay"
    labels = namespace["metadata"]["labels"]
    assert {
        level: labels[f"pod-security.kubernetes.io/{level}"] for level in ("enforce", "warn", "audit")
    } == {
        "enforce": "restricted",
        "warn": "restricted",
        "audit": "restricted",
    }
    assert labels["app.kubernetes.io/part-of"] == "eks-ray-train"
