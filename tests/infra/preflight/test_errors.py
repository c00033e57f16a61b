"""`infra/preflight/errors.py`: the preflight's one error is the kind Pulumi shows as its message alone,
without a Python traceback (every refusal of tests/infra/preflight/ raises it)."""

from __future__ import annotations

import pulumi

from infra.preflight.errors import PreflightError


def test_a_preflight_refusal_is_a_pulumi_run_error_whose_message_is_the_whole_story():
    error = PreflightError("instance type g6.12xlarge is not offered in us-east-2c: set gpuAz to us-east-2a")
    assert isinstance(error, pulumi.RunError)
    assert str(error) == "instance type g6.12xlarge is not offered in us-east-2c: set gpuAz to us-east-2a"
