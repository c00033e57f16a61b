"""The value types of the training flags: each turns a flag's text into its value or raises
argparse's error saying what was expected (argparse prefixes it with the flag's name).

`training.config.settings` names one as each setting's `type`; `training.fabric_probe` parses its
own flags with them. Standard library only.
"""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime
from typing import Any

# More optimizer steps than any fine-tune here takes: 10 million steps of the tiny CPU model's
# 0.1 s would run 12 days, of the throughput preset's 1 s on L4s 4 months. A larger count is a slip.
MAX_STEPS = 10_000_000


def _number(text: str, kind: type[int] | type[float], expected: str) -> Any:
    """The value of `text`, or an argparse error that says what was expected (argparse
    prefixes it with the flag's name)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not math.isfinite(value):  # float("inf"), float("nan") parse; no setting wants them
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# A run's folder under --storage-path: one path segment (no `/`, not `.` or `..`), nothing a shell
# or a URL would read differently.
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def folder_name(text: str) -> str:
    if not _RUN_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a folder name of letters, digits and . _ - (at most 128, no '/'), got {text!r}"
        )
    return text


def integer(text: str) -> int:
    return _number(text, int, "a whole number")


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def step_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_STEPS:_}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a number > 0")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    value = _number(text, float, "a number from 0 to 1")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


def positive_fraction(text: str) -> float:
    value = _number(text, float, "a number > 0 and <= 1")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1, got {text}")
    return value


def replicas(text: str) -> int:
    """`auto` (0: one replica group per node) or a positive count."""
    if text == "auto":
        return 0
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count >= 1, got {text!r}")
    return int(text)


def column_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a column name, got {text!r}")
    return text


def parse_deadline(text: str) -> str:
    """An ISO 8601 time with its UTC offset (`2026-12-05T07:00:00Z`), as UTC `...Z`: the flag's
    type. A time without an offset is refused: the machine's zone is no one's to guess."""
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time in UTC such as 2026-12-05T07:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset: end it with Z (UTC), e.g. {text}Z")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
