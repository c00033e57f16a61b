"""The NCCL/Ray log files the transport verdict reads, as text lines; unreadable input refused.

Arguments are files as given (`-`: stdin) and folders, walked (sorted) for *.log, *.out and *.err
and their rotated parts (`.out.1`: a Ray session `logs/` folder). A file that is missing, not
permitted or binary, or a folder without such files, raises `UnreadableLogError`. Standard library
only, as `workloads.nccl_transport`, which judges the lines, is.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import cast

_LOG_NAME = re.compile(r"\.(?:log|out|err)(?:\.\d+)?$")
_BINARY_PROBE_BYTES = 8192


class UnreadableLogError(Exception):
    """A log argument cannot be read as text: missing, not permitted, binary, or an empty folder."""


def _refuse_folder(error: OSError) -> None:
    raise UnreadableLogError(f"cannot read folder {error.filename}: {error.strerror}")


def iter_log_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
    """Expand the arguments: files as given, folders walked (sorted) for *.log/*.out/*.err (and rotated parts)."""
    for given in paths:
        path = os.fspath(given)
        if path == "-" or not os.path.isdir(path):
            yield path
            continue
        found = False
        for folder, subfolders, names in os.walk(path, onerror=_refuse_folder):
            subfolders.sort()
            for name in sorted(names):
                if _LOG_NAME.search(name):
                    found = True
                    yield os.path.join(folder, name)
        if not found:
            raise UnreadableLogError(f"no *.log, *.out or *.err files under {path}")


def read_lines(path: str) -> Iterator[str]:
    """Yield the text lines of a file (or stdin for `-`); carriage returns split lines too."""
    try:
        stream = cast(
            io.BufferedReader,
            sys.stdin.buffer if path == "-" else open(path, "rb"),  # noqa: SIM115 (closed by the with below)
        )
    except OSError as error:
        raise UnreadableLogError(f"cannot read {path}: {error.strerror}") from error
    with stream:
        try:
            probe = stream.peek(_BINARY_PROBE_BYTES)[:_BINARY_PROBE_BYTES]
            if b"\x00" in probe:
                raise UnreadableLogError(f"{path} is binary, not a text log")
            for raw in stream:
                for piece in raw.split(b"\r"):
                    yield piece.decode("utf-8", errors="replace")
        except OSError as error:
            raise UnreadableLogError(f"cannot read {path}: {error.strerror}") from error


def log_lines(paths: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
    """Every text line of the arguments' log files, file after file; raises UnreadableLogError."""
    for path in iter_log_files(paths):
        yield from read_lines(path)
