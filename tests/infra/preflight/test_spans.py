"""Durations in words (`infra.preflight.spans`), as the preview's refusals and warnings write them."""

from __future__ import annotations

import pytest

from infra.preflight.spans import span


@pytest.mark.parametrize(
    "seconds, words",
    [
        (-5, "0 s"),
        (0, "0 s"),
        (40, "40 s"),
        (59.4, "59 s"),
        (60, "1 min"),
        (14 * 60 + 20, "14 min"),
        (59 * 60 + 29, "59 min"),
        (59 * 60 + 31, "1 h 00 min"),
        (2 * 3600 + 5 * 60, "2 h 05 min"),
        (26 * 3600, "26 h 00 min"),
    ],
)
def test_a_duration_is_written_in_seconds_minutes_or_hours(seconds, words):
    assert span(seconds) == words
