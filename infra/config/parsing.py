"""Parsing primitives of the stack configuration: each turns a raw value into a typed one or
raises `ValueError` with the reason; `ConfigError` is what the program raises with the key named.

Pulumi hands every scalar over as a string and objects and lists as JSON text (`decode`), so the
parsers accept both spellings of a value (`"true"` and `true`, `"3"` and `3`).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pulumi
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class ConfigError(pulumi.RunError):
    """A stack setting is wrong; the message says which key, what value, and how to fix it.

    Subclassing `pulumi.RunError` makes the Pulumi CLI print the message without a traceback.
    """


def decode(value: Any) -> Any:
    """Pulumi hands object and list values over as JSON text; scalars stay strings."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """The closest known key, or the whole list when none is close."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError("expected true or false")


def as_int(minimum: int, maximum: int | None = None, why_maximum: str = "") -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected a whole number")
        try:
            number = int(str(value), 10)
        except ValueError:
            raise ValueError("expected a whole number") from None
        if number < minimum:
            raise ValueError(f"must be at least {minimum}")
        if maximum is not None and number > maximum:
            raise ValueError(f"must be at most {maximum}{f' ({why_maximum})' if why_maximum else ''}")
        return number

    return parse


def matching(pattern: re.Pattern[str], example: str) -> Callable[[Any], str]:
    """A string the whole of which matches `pattern` (`fullmatch`: no trailing newline slips by)."""

    def parse(value: Any) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"expected something like {example}")
        return value

    return parse


def one_of(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def cidr(value: Any) -> str:
    try:
        network = ipaddress.ip_network(str(value), strict=True)
    except ValueError as err:
        raise ValueError(f"not a CIDR block ({err})") from None
    return str(network)


def key_names(model: type[BaseModel]) -> dict[str, str]:
    """A model's stack keys (the camelCase aliases) with their field names."""
    return {field.alias or name: name for name, field in model.model_fields.items()}


def validated(model: type[Model], raw: Mapping[str, Any], prefix: str = "", **given: Any) -> Model:
    """`raw` (keys already known to be the model's) parsed by the model's validators; the first
    refusal becomes a `ConfigError` naming the key, the value as written and the reason.
    `given` are fields that are no stack key (the region), passed by field name."""
    try:
        return model.model_validate({**given, **{key: decode(value) for key, value in raw.items()}})
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        error = first.get("ctx", {}).get("error")
        reason = str(error) if isinstance(error, ValueError) else first["msg"]
        raise ConfigError(f"config key '{prefix}{key}' = {raw.get(key)!r}: {reason}") from None
