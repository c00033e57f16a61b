"""The region's zones: offerings, zones EKS cannot use, and the refusals that name the zone's key."""

from __future__ import annotations

from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import refusal


def test_gpu_type_not_sold_in_the_region():
    message = refusal(FakeAws(region="eu-west-1"))
    assert "config key 'gpuNodeType' = 'g6.12xlarge' is not offered in any zone of eu-west-1" in message
    assert "python -m infra.region_survey --regions eu-west-1" in message


def test_unknown_gpu_type_is_not_offered_anywhere():
    message = refusal(FakeAws(), gpuNodeType="g6.13xlarge")
    assert "config key 'gpuNodeType' = 'g6.13xlarge' is not offered in any zone of us-east-2" in message
    assert "check the name" in message


def test_configured_gpu_zone_that_does_not_offer_the_type():
    message = refusal(FakeAws(offerings={"g6.12xlarge": ["us-east-2a", "us-east-2b"]}), gpuAz="us-east-2c")
    assert "config key 'gpuAz' = 'us-east-2c'" in message
    assert "does not offer gpuNodeType g6.12xlarge" in message
    assert "us-east-2a, us-east-2b: set gpuAz to one of them" in message


def test_configured_gpu_zone_that_does_not_exist():
    message = refusal(FakeAws(), gpuAz="us-east-2d")
    assert "us-east-2d is not an available zone of the region" in message


def test_configured_gpu_zone_where_eks_has_no_control_plane():
    message = refusal(FakeAws(region="us-east-1"), gpuNodeType="p5.48xlarge", gpuAz="us-east-1e")
    assert "us-east-1e is zone use1-az3, where EKS cannot place control plane subnets" in message


def test_configured_gpu_zone_without_the_system_type():
    message = refusal(FakeAws(offerings={"m7i.xlarge": ["us-east-2a", "us-east-2b"]}), gpuAz="us-east-2c")
    assert "does not offer systemNodeType m7i.xlarge" in message


def test_system_type_in_one_zone_leaves_the_control_plane_without_a_second():
    message = refusal(FakeAws(offerings={"m7i.xlarge": ["us-east-2b"]}))
    assert "config key 'systemNodeType' = 'm7i.xlarge' is offered in only one zone of us-east-2" in message
    assert "control plane needs subnets in two zones" in message


def test_no_zone_offers_both_node_types():
    message = refusal(
        FakeAws(offerings={"g6.12xlarge": ["us-east-2c"], "m7i.xlarge": ["us-east-2a", "us-east-2b"]})
    )
    assert "no zone of us-east-2 offers both gpuNodeType g6.12xlarge (us-east-2c)" in message
