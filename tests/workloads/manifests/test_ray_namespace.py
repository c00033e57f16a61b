"""The Ray namespace's Pod Security Standards: baseline enforced, restricted reported."""

from __future__ import annotations

from workloads import manifests


def test_ray_namespace_enforces_baseline_and_reports_restricted():
    labels = manifests.namespace("ray-train")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert (
        labels["pod-security.kubernetes.io/warn"]
        == labels["pod-security.kubernetes.io/audit"]
        == "restricted"
    )
    assert labels["app.kubernetes.io/part-of"] == "eks-ray-train"
