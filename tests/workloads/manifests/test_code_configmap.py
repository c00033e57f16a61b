"""The training code as a ConfigMap: every path restored, the hash, the size limit."""

from __future__ import annotations

import pytest

from tests.harness.manifest_checks import CODE
from tests.harness.paths import REPO_ROOT
from workloads import manifests

ROOT = REPO_ROOT


def test_shipped_code_volume_restores_every_path():
    volume = manifests.code_volume("training-code", CODE)
    paths = {item["path"] for item in volume["configMap"]["items"]}
    assert paths == {*CODE, manifests.CODE_HASH_FILE}
    configmap = manifests.training_code_configmap("training-code", "ray-train", CODE)
    assert {item["key"] for item in volume["configMap"]["items"]} == set(configmap["data"])
    assert configmap["data"][manifests.CODE_HASH_FILE.replace("/", "__")] == manifests.code_hash(CODE)


def test_code_hash_changes_with_the_code():
    changed = {**CODE, "training/loop.py": "print('bye')\n"}
    assert manifests.code_hash(changed) != manifests.code_hash(CODE)
    assert manifests.code_hash(dict(reversed(CODE.items()))) == manifests.code_hash(CODE)


def test_real_training_package_fits_a_configmap():
    files = manifests.collect_code(ROOT)
    assert "training/__init__.py" in files
    manifests.training_code_configmap("training-code", "ray-train", files)


def test_oversized_code_is_refused():
    with pytest.raises(ValueError, match="ConfigMap holds at most"):
        manifests.training_code_configmap("c", "n", {"training/big.txt": "x" * 1_100_000})
