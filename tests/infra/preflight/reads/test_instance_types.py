"""An instance type's facts read through the AWS provider in a mocked preview (tests/harness/fake_aws.py),
and a type AWS does not know refused naming its key."""

from __future__ import annotations

import pytest

from infra.config.stack import ConfigError
from infra.preflight.reads.instance_types import describe_instance_type
from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import read_in_preview


def test_a_gpu_types_facts_come_from_describe_instance_types():
    facts = read_in_preview(
        FakeAws(), lambda: describe_instance_type("g6.12xlarge", "gpuNodeType", "us-east-2")
    )
    assert (facts.vcpus, facts.memory_mib, facts.gpus, facts.gpu_name) == (48, 196608, 4, "NVIDIA L4")
    assert (facts.efa_supported, facts.efa_interfaces, facts.network_cards) == (True, 1, 1)
    assert facts.max_pods == 8 * (30 - 1) + 2  # EKS's formula over its interfaces and addresses
    assert (facts.architectures, facts.ipv4_per_interface, facts.network_performance) == (
        ("x86_64",),
        30,
        "40 Gigabit",
    )


def test_a_type_aws_does_not_know_is_refused_naming_its_key_and_the_command_that_checks_it():
    with pytest.raises(ConfigError) as raised:
        read_in_preview(FakeAws(), lambda: describe_instance_type("g9.huge", "gpuNodeType", "us-east-2"))
    message = str(raised.value)
    assert message.startswith(
        "config key 'gpuNodeType' = 'g9.huge': AWS does not know this instance type in us-east-2"
    )
    assert "aws ec2 describe-instance-types --region us-east-2 --instance-types g9.huge" in message
