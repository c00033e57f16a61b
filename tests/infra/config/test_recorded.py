"""Recorded values read as Pulumi hands them back: a missing key is unknown, an unreadable record is one
line naming the output and the key."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime import rpc

from infra.config.recorded import RecordError
from infra.planner.cost import CostBasis, PredictedRun, capacity_block_price, measured_cost

OUTPUT = "training.cost.measured"
NODES = {"node-a": {"instanceId": "i-0a1b2c3d4e5f60001", "launchTime": "2026-12-05T06:00:00+00:00"}}


def handed_back(value: dict) -> dict:
    """`value` through the SDK's own serialization and back, as a registration's or a provider's
    properties travel (pulumi/runtime/rpc.py `deserialize_properties` drops each None, at any depth)."""
    message = struct_pb2.Struct()
    message.update({"planned": value})
    return rpc.deserialize_properties(message)["planned"]


def test_a_capacity_blocks_predicted_run_comes_back_without_its_price_and_reads_as_unknown():
    predicted = CostBasis(capacity_block_price("cr-1"), None, {}).predicted_run
    sent = {
        "usd_per_gpu_node_hour": predicted.usd_per_gpu_node_hour,
        "price_basis": predicted.price_basis,
        "step_time_s": 1.5,
        "bytes_per_step": None,
    }
    back = handed_back(sent)
    assert set(back) == {"price_basis", "step_time_s"}  # the None values are gone
    recorded = PredictedRun.recorded(back, OUTPUT)
    assert recorded == PredictedRun(price_basis=predicted.price_basis, step_time_s=1.5)
    measured = measured_cost(recorded, NODES, None, "2026-12-05T07:00:00+00:00", {})
    assert measured["gpuNodeHours"] == 1.0 and measured["usd"] is None
    assert measured["priceBasis"].startswith("Capacity Block cr-1: its upfront fee")


def test_a_record_an_older_release_wrote_without_a_field_reads_it_as_unknown():
    assert PredictedRun.recorded({"price_basis": "a list price"}, OUTPUT) == PredictedRun(
        price_basis="a list price"
    )
    assert PredictedRun.recorded({}, OUTPUT) is None and PredictedRun.recorded(None, OUTPUT) is None


@pytest.mark.parametrize(
    ("record", "key", "what"),
    [
        ({"usd_per_gpu_node_hour": 4.6}, "price_basis", "is missing"),
        ({"price_basis": "a list price", "step_time_s": "fast"}, "step_time_s", "cannot be read"),
    ],
)
def test_a_record_that_cannot_be_read_is_one_line_naming_the_output_and_the_key(record, key, what):
    with pytest.raises(RecordError) as raised:
        PredictedRun.recorded(record, OUTPUT)
    message = str(raised.value)
    assert message.startswith(f"{OUTPUT}: the recorded PredictedRun key `{key}` {what}")
    assert "pulumi up --replace" in message and "\n" not in message


def test_a_gpu_node_record_without_its_instance_id_is_named_by_its_node():
    nodes = {**NODES, "node-b": {"unavailable": "EC2 no longer lists it"}}
    measured = measured_cost(None, nodes, None, "2026-12-05T07:00:00+00:00", {})
    assert measured["notCounted"] == {"node-b": "EC2 no longer lists it"}
    assert measured["gpuNodeHours"] == 1.0
