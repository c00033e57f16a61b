"""The node types: an architecture the EKS AMI boots, EFA on the GPU type."""

from __future__ import annotations

import pytest

from infra.config.stack import ConfigError
from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import refusal


def test_gpu_type_without_efa():
    message = refusal(FakeAws(), gpuNodeType="g6.xlarge")
    assert "config key 'gpuNodeType' = 'g6.xlarge' does not support EFA" in message


@pytest.mark.parametrize(
    ("key", "instance_type", "architecture"),
    [
        ("systemNodeType", "m7g.xlarge", "arm64"),
        ("gpuNodeType", "g5g.16xlarge", "arm64"),
        ("systemNodeType", "mac2.metal", "arm64_mac"),
    ],
)
def test_an_instance_type_the_ami_cannot_boot_is_refused_naming_the_key(key, instance_type, architecture):
    message = refusal(FakeAws(), ConfigError, **{key: instance_type})
    assert message.startswith(
        f"config key '{key}' = {instance_type!r}: its CPU architecture is {architecture}"
    )
    assert "x86_64" in message
