"""The flags' value types: each takes what its name says and refuses the rest, saying what it expected."""

from __future__ import annotations

import argparse

import pytest

from training.config.flag_types import (
    MAX_STEPS,
    column_name,
    folder_name,
    fraction,
    integer,
    non_negative_float,
    non_negative_int,
    parse_deadline,
    positive_float,
    positive_fraction,
    positive_int,
    replicas,
    step_count,
)


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (integer, "-3", -3),
        (positive_int, "1", 1),
        (step_count, str(MAX_STEPS), MAX_STEPS),
        (non_negative_int, "0", 0),
        (positive_float, "0.5", 0.5),
        (non_negative_float, "0", 0.0),
        (fraction, "1", 1.0),
        (positive_fraction, "0.25", 0.25),
        (replicas, "auto", 0),
        (replicas, "2", 2),
        (folder_name, "run-1.a_b", "run-1.a_b"),
        (column_name, "text", "text"),
        (parse_deadline, "2026-12-05T08:00:00+01:00", "2026-12-05T07:00:00Z"),
    ],
)
def test_a_value_of_its_kind_is_taken(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (integer, "1.5", "expected a whole number, got '1.5'"),
        (positive_int, "0", "must be >= 1, got 0"),
        (step_count, str(MAX_STEPS + 1), f"must be <= {MAX_STEPS:_}"),
        (non_negative_int, "-1", "must be >= 0, got -1"),
        (positive_float, "inf", "expected a finite number, got 'inf'"),
        (non_negative_float, "-0.1", "must be >= 0, got -0.1"),
        (fraction, "1.5", "must be from 0 to 1, got 1.5"),
        (positive_fraction, "0", "must be > 0 and <= 1, got 0"),
        (replicas, "0", "expected 'auto' or a count >= 1, got '0'"),
        (folder_name, "../up", "expected a folder name"),
        (column_name, " ", "expected a column name"),
        (parse_deadline, "2026-12-05T07:00:00", "has no UTC offset"),
    ],
)
def test_anything_else_is_refused_saying_what_was_expected(parse, text, says):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert says in str(refused.value)
