"""The planner against published figures and measurements: AWS's sample's bytes, and docs/benchmarks.md
quotes the comparison the planner computes."""

from __future__ import annotations

import pytest

from infra.planner import calibration
from tests.harness.program import ROOT


def test_the_fsdp_bytes_are_the_rings_share_of_gathers_and_reduces():
    """AWS's sample (bf16 reduce): 3 x 7/8 x 2 bytes x 1.54B parameters, the issue's ~8 GB."""
    sample = calibration.aws_sample_forecast()
    assert sample.inter_node_bytes_per_step == pytest.approx(3 * 7 / 8 * 2 * 1_543_714_304)


def test_the_benchmark_comparison_is_what_the_planner_computes():
    document = (ROOT / "docs" / "benchmarks.md").read_text()
    assert calibration.comparison_table() in document
