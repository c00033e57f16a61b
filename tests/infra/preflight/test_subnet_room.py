"""The GPU subnet's addresses against what the VPC CNI holds for the GPU nodes."""

from __future__ import annotations

from infra.config.stack import ConfigError
from infra.preflight.subnet_room import gpu_subnet_shortfall
from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import place, refusal


def test_gpu_subnet_shortfall_counts_two_full_interfaces_a_node():
    """The VPC CNI holds the interface its pods use and a warm one (WARM_ENI_TARGET=1), each with
    all its addresses; AWS reserves five addresses of a subnet. A /25 has 123 usable."""
    assert gpu_subnet_shortfall("10.0.14.0/25", 2, 30) == 0
    assert gpu_subnet_shortfall("10.0.14.0/25", 3, 30) == 57


def test_a_gpu_subnet_too_small_for_its_nodes_is_refused_naming_vpc_cidr():
    fake = FakeAws(
        region="us-east-1",
        offerings={
            "g6.12xlarge": ["us-east-1d"],
            "m7i.xlarge": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"],
        },
    )
    message = refusal(fake, ConfigError, vpcCidr="10.0.0.0/20", gpuNodeCount=3)
    assert message.startswith(
        "config key 'vpcCidr' = '10.0.0.0/20': the GPU subnet in us-east-1d is 10.0.14.0/25"
    )
    _, gpu_az, _ = place(fake, vpcCidr="10.0.0.0/16", gpuNodeCount=3)
    assert gpu_az == "us-east-1d"
