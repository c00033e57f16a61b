"""The key tables of docs/configuration.md, generated from the one declaration of each key.

`python -m tools docs` rewrites them in place, each between its markers (`tools/regions.py`);
`tests/test_docs.py` fails while the document and the code differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.config.stack import REGION_KEY_DESCRIPTION, StackKeys
from infra.config.training_settings import PROGRAM_FLAGS, TrainingRunKeys, key_of_flag
from tools.regions import replace_regions

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = "| key | default | meaning |\n| --- | --- | --- |\n"


def shown_default(value: Any) -> str:
    """A default as the docs write it: YAML spelling in a code span, or 'none' for no value."""
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def key_rows(model: type[BaseModel]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = extra.get("shown_default") or shown_default(field.get_default(call_default_factory=True))
        rows.append(f"| `{field.alias or name}` | {default} | {field.description} |")
    return rows


def tables() -> dict[str, str]:
    """Each generated table by the name of its region in the document."""
    stack = [f"| `aws:region` | per stack file | {REGION_KEY_DESCRIPTION} |", *key_rows(StackKeys)]
    program = [f"| `{key_of_flag(flag)}` | {why} |" for flag, why in PROGRAM_FLAGS.items()]
    return {
        "stack-keys": HEADER + "\n".join(stack) + "\n",
        "judging-keys": HEADER + "\n".join(key_rows(TrainingRunKeys)) + "\n",
        "program-flags": "| key | why |\n| --- | --- |\n" + "\n".join(program) + "\n",
    }


def rewritten(document: str) -> str:
    """The document with each generated table replaced by the code's."""
    return replace_regions(document, tables(), "docs/configuration.md")
