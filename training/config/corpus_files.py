"""Corpus discovery: which files under --data/--eval-data are read, and how (no torch, no ray)."""

from __future__ import annotations

from pathlib import Path

SHIPPED_CORPUS = Path(__file__).resolve().parents[1] / "corpus"
# The --data value that names no corpus: random tokens.
SYNTHETIC = "synthetic"
DEFAULT_TEXT_COLUMN = "text"
# A corpus file's suffix says how it is read: a whole text document, JSON lines, or Parquet
# rows, each row's document in its --text-column (or a conversation in its "messages" column).
CORPUS_FORMATS = {".txt": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
CORPUS_SUFFIXES = tuple(CORPUS_FORMATS)


def corpus_files(data: str, flag: str = "--data") -> list[str]:
    """Corpus files under a path, sorted so every reader sees the same order."""
    path = Path(data)
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        raise ValueError(
            f"{flag} {data!r}: no such file or folder" + (" (or use 'synthetic')" if flag == "--data" else "")
        )
    files = [str(p.resolve()) for p in candidates if p.suffix in CORPUS_SUFFIXES]
    if not files:
        raise ValueError(f"{flag} {data!r}: no {'/'.join(CORPUS_SUFFIXES)} files in it")
    return files


def corpus_format(path: str) -> str:
    """'text', 'json' or 'parquet', from the file's suffix."""
    suffix = Path(path).suffix
    if suffix not in CORPUS_FORMATS:
        raise ValueError(f"unsupported corpus file {path}: use {'/'.join(CORPUS_SUFFIXES)}")
    return CORPUS_FORMATS[suffix]
