"""The training code, shipped as a ConfigMap and mounted read-only in every Ray pod."""

from __future__ import annotations

import hashlib
from pathlib import Path

from platform_contract import (
    PART_OF_LABELS,
)

CODE_MOUNT = "/opt/eks-ray-train"
CODE_HASH_FILE = ".code-hash"
CONFIGMAP_LIMIT_BYTES = 1_000_000

SHIPPED_SUFFIXES = {".py", ".json", ".txt", ".jsonl"}


def collect_code(root: Path, package: str = "training") -> dict[str, str]:
    """Files of the training package by POSIX path relative to `root` (sources and small data)."""
    files = {}
    for path in sorted((root / package).rglob("*")):
        if path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts:
            files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return files


def code_hash(files: dict[str, str]) -> str:
    """Content hash of the shipped code: a change triggers a new training run."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()[:16]


def _configmap_key(path: str) -> str:
    """ConfigMap keys allow no '/', so paths are flattened; volume items restore them."""
    return path.replace("/", "__")


def training_code_configmap(name: str, namespace_name: str, files: dict[str, str]) -> dict:
    """All shipped files plus the content hash, which the run checks before it submits."""
    data = {_configmap_key(path): content for path, content in files.items()}
    data[_configmap_key(CODE_HASH_FILE)] = code_hash(files)
    size = sum(len(key) + len(value.encode()) for key, value in data.items())
    if size > CONFIGMAP_LIMIT_BYTES:
        raise ValueError(
            f"the training code is {size} bytes; a ConfigMap holds at most {CONFIGMAP_LIMIT_BYTES}"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace_name,
            "labels": dict(PART_OF_LABELS),
        },
        "data": data,
    }


def code_volume(configmap_name: str, files: dict[str, str]) -> dict:
    return {
        "name": "training-code",
        "configMap": {
            "name": configmap_name,
            "items": [
                {"key": _configmap_key(path), "path": path} for path in sorted([*files, CODE_HASH_FILE])
            ],
        },
    }
