"""The rows of a Markdown table in a docs page, for the tests that hold a page's table to the code."""

from __future__ import annotations

from pathlib import Path


def table(document: Path, heading: str, index: int = 0) -> list[list[str]]:
    """Rows of the `index`-th table under `heading` (before the next heading), as lists of cell
    texts (header and rule dropped)."""
    section = document.read_text().split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    end = 0
    for _ in range(index + 1):
        start = next(i for i in range(end, len(lines)) if lines[i].startswith("|"))
        end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip().split("|")[1:-1]] for line in lines[start + 2 : end]]
