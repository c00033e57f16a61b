"""Reading a resource as the engine shows it to a policy (`policy.rules.properties`): unknowns kept
as unknowns, nested and list values, booleans as bools or strings, IAM documents, URNs and links."""

from __future__ import annotations

import json

import pytest

from policy.rules import properties
from policy.rules.properties import StackResource

UNKNOWN = next(iter(properties.UNKNOWN_SENTINELS))


def test_a_value_unknown_at_preview_stays_unknown_through_a_dig():
    assert properties.is_unknown(UNKNOWN) and not properties.is_unknown("true")
    assert properties.dig({"a": {"b": 1}}, "a", "b") == 1
    assert properties.dig({"a": UNKNOWN}, "a", "b") == UNKNOWN
    assert properties.dig({"a": "text"}, "a", "b") is None and properties.dig({}, "a") is None


def test_lists_read_as_lists_and_a_single_iam_element_as_one():
    assert properties.items([1, 2]) == [1, 2] and properties.items(("x",)) == ["x"]
    assert properties.items("abc") == [] and properties.items(None) == [] and properties.items(UNKNOWN) == []
    assert properties.as_list("s3:GetObject") == ["s3:GetObject"] and properties.as_list(["a", "b"]) == [
        "a",
        "b",
    ]


@pytest.mark.parametrize(
    "value, true, false",
    [
        (True, True, False),
        ("TRUE", True, False),
        ("false", False, True),
        (False, False, True),
        (None, False, False),
        (UNKNOWN, False, False),
    ],
)
def test_booleans_arrive_as_bools_or_as_strings(value, true, false):
    assert (properties.is_true(value), properties.is_false(value)) == (true, false)


def test_a_policy_documents_statements_whatever_its_form():
    statement = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}
    assert properties.policy_statements(json.dumps({"Statement": [statement]})) == [statement]
    assert properties.policy_statements({"Statement": statement}) == [statement]
    assert properties.policy_statements(UNKNOWN) is None
    assert properties.policy_statements("{not json") == []


def test_types_and_urns_read_into_their_parts():
    assert properties.type_kind(properties.RAY_CLUSTER) == ("ray.io/v1", "RayCluster")
    assert properties.type_kind("odd") == ("", "")
    assert (
        properties.stack_of("urn:pulumi:dev-alice::eks-ray-train::aws:s3/bucket:Bucket::ckpt") == "dev-alice"
    )
    assert [properties.is_dev_stack(s) for s in ("dev", "dev-a", "a-dev", "prod", "devices")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_resources_link_by_known_name_or_id_else_by_dependency():
    bucket = StackResource(properties.BUCKETS[0], "urn:b", {"bucket": "ckpt", "id": UNKNOWN}, ())
    by_name = StackResource(properties.BUCKET_POLICY, "urn:p1", {"bucket": "ckpt"}, ())
    by_dependency = StackResource(properties.BUCKET_POLICY, "urn:p2", {"bucket": UNKNOWN}, ("urn:b",))
    unrelated = StackResource(properties.BUCKET_POLICY, "urn:p3", {"bucket": "other"}, ())
    others = [by_name, by_dependency, unrelated]
    assert properties.linked(bucket, "bucket", others, "bucket") == [by_name, by_dependency]
