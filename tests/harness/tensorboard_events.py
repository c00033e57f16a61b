"""TensorBoard's event files read back without TensorBoard, for tests of what a run logged."""

from __future__ import annotations

import struct
from pathlib import Path


def read_events(folder: Path) -> list:
    """Every Event of the event files in `folder`, file by file in name order. An event file is a
    sequence of records: 8-byte little-endian length, 4-byte CRC, the serialized Event, 4-byte CRC."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            events.append(Event.FromString(data[offset + 12 : offset + 12 + length]))
            offset += 12 + length + 4
    return events


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar of the event files in `folder`, by tag and step."""
    scalars: dict[str, dict[int, float]] = {}
    for event in read_events(folder):
        for value in event.summary.value:
            scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars
