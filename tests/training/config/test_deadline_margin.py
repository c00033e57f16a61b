"""The margin a run under --deadline keeps back and the checkpoint and export estimates it starts
from: plain arithmetic, checked against the model's size and the dtypes the export writes."""

from __future__ import annotations

import pytest

from training.components.checkpoint import EXPORT_DTYPES
from training.config.deadline_margin import (
    CHECKPOINT_BYTES_PER_PARAMETER,
    ESTIMATED_WRITE_BYTES_PER_S,
    EXPORT_BYTES_PER_PARAMETER,
    WIND_DOWN_S,
    estimated_checkpoint_s,
    margin_s,
)


def test_the_margin_is_a_checkpoint_two_slowest_steps_an_evaluation_an_export_and_the_wind_down():
    assert margin_s(checkpoint_s=90.0, slowest_step_s=3.0, eval_s=20.0) == 116.0 + WIND_DOWN_S
    assert margin_s(checkpoint_s=90.0, slowest_step_s=3.0, eval_s=0.0, export_s=4.0) == 100.0 + WIND_DOWN_S


def test_the_checkpoint_estimate_is_the_model_and_adamw_state_at_the_stated_rate():
    parameters = 1_543_714_304  # Qwen2.5-1.5B
    seconds = estimated_checkpoint_s(parameters)
    assert parameters * CHECKPOINT_BYTES_PER_PARAMETER == pytest.approx(18.5e9, rel=0.01)
    assert seconds == pytest.approx(18.5e9 / ESTIMATED_WRITE_BYTES_PER_S, rel=0.01)


def test_the_export_sizes_the_margin_reckons_with_are_the_dtypes_the_export_writes():
    assert {name: dtype.itemsize for name, dtype in EXPORT_DTYPES.items()} == EXPORT_BYTES_PER_PARAMETER
