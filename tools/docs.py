"""Everything the documents show that is generated from the code, and the one command that
rewrites it all (`python -m tools docs`): the marked regions of the key tables of
docs/configuration.md (`tools/config_tables.py`), the policy rules of policy/README.md and the
layers and chart pins of docs/architecture.md (`tools/catalogues.py`); and the whole files drawn
from the code, the dashboard's picture (`infra/resources/dashboard_picture.py`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from infra.resources.dashboard_picture import default_picture
from tools import catalogues, config_tables

# Files generated whole, and what draws each.
DRAWN: dict[Path, Callable[[], str]] = {catalogues.ROOT / "docs" / "dashboard.svg": default_picture}


def rewriters() -> dict[Path, Callable[[str], str]]:
    """Each document with generated regions, and what rewrites its text from the code."""
    found: dict[Path, Callable[[str], str]] = {
        document: partial(catalogues.rewritten, document) for document in catalogues.tables()
    }
    found[config_tables.CONFIGURATION] = config_tables.rewritten
    return found


def generated() -> dict[Path, str]:
    """Every generated file's text as the code writes it; a lost region marker raises `MissingRegion`."""
    texts = {document: rewrite(document.read_text()) for document, rewrite in rewriters().items()}
    return texts | {path: draw() for path, draw in DRAWN.items()}


def stale() -> list[Path]:
    """The generated files that differ from the code's."""
    return [path for path, text in generated().items() if path.read_text() != text]


def write() -> list[Path]:
    """Rewrite every generated file, none unless every region is found; the files."""
    texts = generated()
    for path, text in texts.items():
        path.write_text(text)
    return list(texts)
