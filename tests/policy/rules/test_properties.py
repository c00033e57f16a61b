"""`policy/rules/properties.py`: reading a resource's properties as the policy engine hands them over
(nested booleans as strings, values unknown at preview as sentinels); every rule reads through it
(tests/policy/rules/test_<area>.py)."""

from __future__ import annotations

import json

from pulumi_policy import proxy as policy_proxy

from policy.rules.properties import (
    StackResource,
    as_list,
    dig,
    is_dev_stack,
    is_false,
    is_true,
    is_unknown,
    items,
    linked,
    policy_statements,
    stack_of,
    type_kind,
)

UNKNOWN = policy_proxy.UNKNOWN_STRING_VALUE


def test_dig_stops_at_a_missing_step_or_an_unknown_one():
    assert dig({"a": {"b": 1}}, "a", "b") == 1
    assert dig({"a": {}}, "a", "b", "c") is None
    assert dig({"a": UNKNOWN}, "a", "b") == UNKNOWN
    assert is_unknown(dig({"a": UNKNOWN}, "a", "b"))
    assert not is_unknown("a known string")


def test_booleans_read_as_bools_or_as_bridged_strings():
    assert is_true(True) and is_true("true") and is_true("True")
    assert is_false(False) and is_false("false")
    assert not is_true(UNKNOWN) and not is_false(UNKNOWN) and not is_true(None)


def test_lists_read_from_one_value_or_many_and_none_from_unknown():
    assert items(["a", "b"]) == ["a", "b"]
    assert items(UNKNOWN) == [] and items(None) == []
    assert as_list("s3:GetObject") == ["s3:GetObject"]
    assert as_list(["a", "b"]) == ["a", "b"]


def test_policy_statements_from_text_or_a_dict_and_none_while_unknown():
    statement = {"Effect": "Allow", "Action": "s3:*"}
    assert policy_statements(json.dumps({"Statement": statement})) == [statement]
    assert policy_statements({"Statement": [statement]}) == [statement]
    assert policy_statements("not json") == []
    assert policy_statements(UNKNOWN) is None


def test_types_and_stacks_read_from_their_tokens():
    assert type_kind("kubernetes:ray.io/v1:RayCluster") == ("ray.io/v1", "RayCluster")
    assert stack_of("urn:pulumi:prod::eks-ray-train::aws:s3/bucket:Bucket::b") == "prod"
    assert [is_dev_stack(name) for name in ("dev", "dev-alice", "alice-dev", "prod", "develop")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_linked_finds_others_by_known_name_or_by_dependency():
    bucket = StackResource("aws:s3/bucket:Bucket", "urn:b", {"bucket": "ckpt", "id": UNKNOWN}, ())
    by_name = StackResource("aws:s3/bucketPolicy:BucketPolicy", "urn:p1", {"bucket": "ckpt"}, ())
    by_dependency = StackResource(
        "aws:s3/bucketPolicy:BucketPolicy", "urn:p2", {"bucket": UNKNOWN}, ("urn:b",)
    )
    other = StackResource("aws:s3/bucketPolicy:BucketPolicy", "urn:p3", {"bucket": "other"}, ())
    assert linked(bucket, "bucket", [by_name, by_dependency, other], "bucket") == [by_name, by_dependency]
