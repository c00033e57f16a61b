"""A document's generated regions: the lines between `<!-- BEGIN GENERATED: name -->` and
`<!-- END GENERATED: name -->`, found by those markers alone, never by the prose around them."""

from __future__ import annotations

import re

# The one command that rewrites every generated region (tools/__main__.py).
COMMAND = "python -m tools docs"


class MissingRegion(ValueError):
    """A document lacks a region's markers, or holds them twice or out of order: one line that
    names the document, the region and the command."""


def begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED: {name} -->"


def end(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def names(document: str) -> list[str]:
    """The names of the regions a document marks, in order."""
    return re.findall(r"^<!-- BEGIN GENERATED: (\S+) -->$", document, flags=re.MULTILINE)


def replace_regions(document: str, regions: dict[str, str], where: str) -> str:
    """`document` (the text of the file `where`) with each region named in `regions` holding its
    value (text ending in a newline) between its markers."""
    for name, text in regions.items():
        lines = document.split("\n")
        starts = [index for index, line in enumerate(lines) if line == begin(name)]
        ends = [index for index, line in enumerate(lines) if line == end(name)]
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            raise MissingRegion(
                f"{where}: the generated region {name!r} needs one line `{begin(name)}` and, below it, "
                f"one line `{end(name)}`; put them around its table and run `{COMMAND}`"
            )
        document = "\n".join([*lines[: starts[0] + 1], text.removesuffix("\n"), *lines[ends[0] :]])
    return document
