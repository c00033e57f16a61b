"""Values a stack records and reads back, read as Pulumi hands them back.

Pulumi drops a None at every depth on the way: the Python SDK's `deserialize_properties` leaves out
each value that deserializes to None, in a map nested at any depth as at the top (pulumi/runtime/rpc.py,
"We treat values that deserialize to 'None' as if they don't exist"), and the state file keeps no null
either. A record written by an older release lacks the fields added since. So a key may be missing,
and a missing key means unknown: a record's type gives each such field a default of None. A record
that still cannot be read (a required key missing, a value of the wrong type) stops the program with
one line naming the output and the key (`RecordError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import pulumi
from pydantic import TypeAdapter, ValidationError

Record = TypeVar("Record")

# What runs the job again, so that it records its values anew.
RERECORD = (
    "running the job again records it anew: `pulumi up --replace <URN>`, the TrainingRun's URN from "
    "`pulumi stack --show-urns`"
)


class RecordError(pulumi.RunError):
    """A recorded value the program cannot read; `pulumi.RunError` prints it without a traceback."""


def read_record(kind: type[Record], value: Mapping[str, Any] | None, output: str) -> Record | None:
    """`value` as a `kind` (a dataclass or model whose optional fields default to None); None for a
    run that recorded nothing. `output`: the stack output or input the value is read for, named in
    the error."""
    if not value:
        return None
    try:
        return TypeAdapter(kind).validate_python(dict(value))
    except ValidationError as error:
        problem = error.errors()[0]
        key = ".".join(str(part) for part in problem["loc"])
        what = "is missing" if problem["type"] == "missing" else f"cannot be read: {problem['msg']}"
        raise RecordError(
            f"{output}: the recorded {kind.__name__} key `{key}` {what} (got {dict(value)!r}); {RERECORD}"
        ) from None
