"""`infra/preflight/spans.py`: durations in words, as the preview's messages write them (read in the
messages of test_window.py)."""

from __future__ import annotations

import pytest

from infra.preflight.spans import span


@pytest.mark.parametrize(
    "seconds, words",
    [
        (-5, "0 s"),
        (40, "40 s"),
        (59.4, "59 s"),
        (60, "1 min"),
        (14 * 60 + 20, "14 min"),
        (3600, "1 h 00 min"),
        (7500, "2 h 05 min"),
    ],
)
def test_a_span_in_words(seconds, words):
    assert span(seconds) == words
