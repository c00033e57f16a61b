"""KubeRay's CustomResourceDefinitions, vendored from the pinned chart's tag and applied by the program."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

from workloads.manifests.charts import KUBERAY_OPERATOR

# KubeRay's CRDs as its chart ships them in `crds/` (which Helm installs once and never upgrades),
# vendored unchanged from the tag of the pinned chart: the program applies them itself.
KUBERAY_CRD_DIR = Path(__file__).resolve().parent.parent / "crds" / f"kuberay-v{KUBERAY_OPERATOR.version}"
KUBERAY_CRD_FILES = (
    "ray.io_rayclusters.yaml",
    "ray.io_raycronjobs.yaml",
    "ray.io_rayjobs.yaml",
    "ray.io_rayservices.yaml",
)
# pulumi-kubernetes: apply with `force`, taking over the fields another field manager (Helm, which
# created these CRDs on stacks deployed before the program owned them) set to other values.
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"


@functools.cache
def _vendored_crd(path: Path) -> str:
    """The CRD file as JSON text: parsed once (4 MB of YAML take seconds), copied cheaply after."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return json.dumps(yaml.load(path.read_text(encoding="utf-8"), Loader=loader))


def kuberay_crds() -> list[dict]:
    """The operator's CRDs of the pinned version, as the program applies them (server-side, forced).

    Each is the vendored upstream file plus the annotation that lets the apply take the fields over
    from Helm on stacks where Helm created the CRD; the object (and every RayCluster) stays.
    """
    crds = []
    for file_name in KUBERAY_CRD_FILES:
        crd = json.loads(_vendored_crd(KUBERAY_CRD_DIR / file_name))
        crd["metadata"].setdefault("annotations", {})[PATCH_FORCE_ANNOTATION] = "true"
        crds.append(crd)
    return crds
