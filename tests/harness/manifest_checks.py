"""What the tests of `workloads/manifests/` share: the Kubernetes version their schemas are of, a
small code bundle, and KubeRay's vendored CRDs as parsed YAML."""

from __future__ import annotations

import yaml

from workloads import manifests

KUBERNETES_VERSION = "1.36.0"
CODE = {
    "training/__init__.py": "",
    "training/loop.py": "print('hi')\n",
    "training/architectures/tiny.json": "{}",
}


def vendored_crd(file_name: str) -> dict:
    return yaml.load(
        (manifests.KUBERAY_CRD_DIR / file_name).read_text(),
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )
