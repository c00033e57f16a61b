"""KubeRay's vendored CRDs: the pinned chart's files unchanged, applied forced, too large for a client-side apply."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.harness.manifest_checks import vendored_crd
from workloads import manifests

# Git blob ids of `helm-chart/kuberay-operator/crds/*` at kuberay tag v1.7.0 (commit 59d663ae),
# the chart's whole `crds/` folder (`git ls-tree v1.7.0 helm-chart/kuberay-operator/crds`).
KUBERAY_CRD_BLOBS = {
    "ray.io_rayclusters.yaml": "ff0be58ada3bd457605eff1f258c16df21e61e21",
    "ray.io_raycronjobs.yaml": "bc8375d655b433333d8be5848e9caf28e0576b7b",
    "ray.io_rayjobs.yaml": "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0",
    "ray.io_rayservices.yaml": "7ee63d6ddd11237a5649e04b3a8db3c52074c867",
}


def git_blob_id(path: Path) -> str:
    content = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def test_vendored_crds_are_the_pinned_charts_unchanged():
    """Every CRD of the chart's `crds/`, byte for byte; the folder is named after the pinned chart."""
    assert manifests.KUBERAY_CRD_DIR.name == f"kuberay-v{manifests.KUBERAY_OPERATOR.version}"
    assert manifests.KUBERAY_OPERATOR.version == "1.7.0", "re-vendor the CRDs and their blob ids"
    assert sorted(path.name for path in manifests.KUBERAY_CRD_DIR.iterdir()) == sorted(KUBERAY_CRD_BLOBS)
    assert set(manifests.KUBERAY_CRD_FILES) == set(KUBERAY_CRD_BLOBS)
    for name, blob in KUBERAY_CRD_BLOBS.items():
        assert git_blob_id(manifests.KUBERAY_CRD_DIR / name) == blob, name


def test_crds_are_applied_forced_and_as_upstream_wrote_them():
    crds = manifests.kuberay_crds()
    assert [crd["metadata"]["name"] for crd in crds] == [
        "rayclusters.ray.io",
        "raycronjobs.ray.io",
        "rayjobs.ray.io",
        "rayservices.ray.io",
    ]
    for crd, file_name in zip(crds, manifests.KUBERAY_CRD_FILES, strict=True):
        assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        assert crd["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION] == "true"
        upstream = vendored_crd(file_name)
        del crd["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION]
        assert crd == upstream
    # Each call is a fresh copy: the program's edits never reach the cached text.
    assert manifests.kuberay_crds()[0]["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION] == "true"


def test_the_raycluster_crd_is_too_large_for_a_client_side_apply():
    """kubectl's and pulumi-kubernetes's client-side apply keep the whole object in the
    `last-applied-configuration` annotation, and the API server refuses annotations over 256 KiB
    (apimachinery `TotalAnnotationSizeLimitB`): only server-side apply can apply this CRD."""
    crd = manifests.kuberay_crds()[0]
    assert len(json.dumps(crd, separators=(",", ":"))) > 256 * 1024
