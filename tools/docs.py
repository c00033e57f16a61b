"""Every generated region of the documents, and the one command that rewrites them all
(`python -m tools docs`): the key tables of docs/configuration.md (`tools/config_tables.py`), the
policy rules of policy/README.md and the layers and chart pins of docs/architecture.md
(`tools/catalogues.py`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from tools import catalogues, config_tables


def rewriters() -> dict[Path, Callable[[str], str]]:
    """Each document with generated regions, and what rewrites its text from the code."""
    found: dict[Path, Callable[[str], str]] = {
        document: partial(catalogues.rewritten, document) for document in catalogues.tables()
    }
    found[config_tables.CONFIGURATION] = config_tables.rewritten
    return found


def stale() -> list[Path]:
    """The documents whose generated regions differ from the code's."""
    return [
        document
        for document, rewrite in rewriters().items()
        if rewrite(document.read_text()) != document.read_text()
    ]


def write() -> list[Path]:
    """Rewrite every document's generated regions, none written unless all are found; the documents."""
    texts = {document: rewrite(document.read_text()) for document, rewrite in rewriters().items()}
    for document, text in texts.items():
        document.write_text(text)
    return list(texts)
