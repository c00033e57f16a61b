"""The checkpoint benchmark's pure readings: a checkpoint's cost over the baseline's steps (spread
over the interval by `training.components.async_checkpoint.stall_fraction`, tested beside it)."""

from __future__ import annotations

import pytest

from bench.checkpoint_overhead import extra_seconds, overhead_fraction


def test_a_stall_on_one_step_counts_in_full():
    """A mean, not a median: one step 1 s longer than three 1 s steps costs 25 %, 1 s."""
    baseline = [1.0, 1.0, 1.0, 1.0]
    measured = [1.0, 2.0, 1.0, 1.0]
    assert overhead_fraction(baseline, measured) == pytest.approx(0.25)
    assert extra_seconds(baseline, measured) == pytest.approx(1.0)
    # Steps the write behind slows count too: 4 steps each 0.1 s slower.
    assert extra_seconds(baseline, [1.1] * 4) == pytest.approx(0.4)
    assert overhead_fraction(baseline, baseline) == 0.0
