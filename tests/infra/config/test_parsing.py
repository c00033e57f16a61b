"""The primitives every key's parser is built from (`infra.config.parsing`), each on its own: the
engine's text decoded, the reason a value is refused, and the first refusal named by its key."""

from __future__ import annotations

import re
from typing import Annotated

import pytest
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config.parsing import (
    ConfigError,
    as_bool,
    as_int,
    cidr,
    decode,
    did_you_mean,
    key_names,
    matching,
    one_of,
    validated,
)


class Keys(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, alias_generator=to_camel, validate_by_name=True)

    node_count: Annotated[int, BeforeValidator(as_int(1, 3, "the quota"))] = Field(default=1)
    public: Annotated[bool, BeforeValidator(as_bool)] = Field(default=True)


def test_the_engine_hands_objects_and_lists_over_as_json_text():
    assert decode('{"a": 1}') == {"a": 1} and decode("[1, 2]") == [1, 2]
    assert decode("3") == "3" and decode("{not json") == "{not json" and decode(7) == 7


def test_a_misspelt_key_gets_the_closest_one_else_the_whole_list():
    assert did_you_mean("gpuNodeCont", ["gpuNodeCount", "image"]) == "did you mean 'gpuNodeCount'?"
    assert did_you_mean("zzz", ["image", "gpuNodeCount"]) == "known keys: gpuNodeCount, image"


def test_booleans_are_true_or_false_in_any_case():
    assert as_bool(True) is True and as_bool("TRUE") is True and as_bool("false") is False
    with pytest.raises(ValueError, match="expected true or false"):
        as_bool("yes")


def test_whole_numbers_within_bounds_and_the_bound_says_why():
    parse = as_int(1, 3, "the quota")
    assert parse("2") == 2 and parse(3) == 3
    for value, reason in [("0", "must be at least 1"), ("4", "must be at most 3 (the quota)")]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            parse(value)
    for written in (True, "1.5", "two"):
        with pytest.raises(ValueError, match="expected a whole number"):
            parse(written)


def test_a_shape_must_match_the_whole_value():
    parse = matching(re.compile(r"[a-z]+"), "ray")
    assert parse("ray") == "ray"
    for value in ("ray\n", "Ray", 3):
        with pytest.raises(ValueError, match="expected something like ray"):
            parse(value)


def test_one_of_names_the_choices():
    assert one_of("keep", "release")("keep") == "keep"
    with pytest.raises(ValueError, match="expected one of keep, release"):
        one_of("keep", "release")("drop")


def test_a_cidr_block_has_no_host_bits():
    assert cidr("10.0.0.0/16") == "10.0.0.0/16"
    with pytest.raises(ValueError, match="not a CIDR block"):
        cidr("10.0.0.1/16")


def test_the_first_refusal_names_the_key_as_written_and_the_reason():
    assert key_names(Keys) == {"nodeCount": "node_count", "public": "public"}
    assert validated(Keys, {"nodeCount": "2", "public": "false"}) == Keys(node_count=2, public=False)
    with pytest.raises(ConfigError) as raised:
        validated(Keys, {"nodeCount": "9"}, prefix="training.")
    assert str(raised.value) == "config key 'training.nodeCount' = '9': must be at most 3 (the quota)"
