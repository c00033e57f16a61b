"""The architectures `--init random` builds: shipped names in training/architectures or JSON files (no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[1] / "architectures"


def is_shipped(name: str) -> bool:
    """Whether `name` is a shipped architecture (training/architectures/<name>.json)."""
    return (CONFIG_DIR / f"{name}.json").is_file()


def resolve_model_config(name_or_path: str) -> Path:
    """A shipped architecture name (`tiny`) or a path to a config JSON."""
    shipped = CONFIG_DIR / f"{name_or_path}.json"
    if shipped.is_file():
        return shipped
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
    raise ValueError(f"--model-config {name_or_path!r}: neither a shipped config ({names}) nor a JSON file")


def load_model_config(name_or_path: str) -> dict[str, Any]:
    path = resolve_model_config(name_or_path)
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"--model-config {name_or_path}: {path} is not a readable JSON file ({error})"
        ) from None
    if not isinstance(values, dict):
        raise ValueError(
            f"--model-config {name_or_path}: {path} holds no JSON object (a transformers config)"
        )
    return values
