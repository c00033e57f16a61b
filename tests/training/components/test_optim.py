"""The learning-rate schedule."""

from __future__ import annotations

import pytest

from training.components.optim import learning_rate
from training.config.run_config import (
    parse_args,
)


def test_warmup_is_linear_then_constant():
    config = parse_args(["--lr", "0.01", "--warmup-steps", "4"])
    assert [learning_rate(config, step) for step in (1, 2, 4, 5, 100)] == pytest.approx(
        [0.0025, 0.005, 0.01, 0.01, 0.01]
    )
