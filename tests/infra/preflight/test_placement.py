"""The preflight's placement under Pulumi mocks: the zones it picks, and that it registers nothing."""

from __future__ import annotations

from infra.config.stack import ConfigError
from tests.harness.fake_aws import FakeAws, capacity_reservation
from tests.harness.preflight_run import QUOTA_TOKEN, RESERVATION, place, refusal


def test_default_stack_gets_first_zone_and_a_second_for_the_control_plane():
    fake = FakeAws()
    placement, gpu_az, cluster_azs = place(fake)
    assert (gpu_az, cluster_azs) == ("us-east-2a", ["us-east-2a", "us-east-2b"])
    assert placement.gpu_node.instance_type == "g6.12xlarge"
    assert (
        placement.gpu_node.vcpus,
        placement.gpu_node.efa_interfaces,
        placement.gpu_node.network_cards,
    ) == (48, 1, 1)
    assert placement.system_node.instance_type == "m7i.xlarge"
    assert placement.capacity_reservation_id is None
    quota_codes = [args["quotaCode"] for token, args in fake.calls if token == QUOTA_TOKEN]
    assert sorted(quota_codes) == ["L-1216C47A", "L-DB2E81BA"]


def test_automatic_zone_does_not_depend_on_the_order_aws_lists_offerings():
    fake = FakeAws(region="us-east-1", offerings={"g6.12xlarge": ["us-east-1f", "us-east-1d", "us-east-1b"]})
    _, gpu_az, cluster_azs = place(fake)
    assert gpu_az == "us-east-1b"
    assert cluster_azs == ["us-east-1b", "us-east-1a"]


def test_automatic_zones_avoid_zones_where_eks_has_no_control_plane():
    fake = FakeAws(
        region="us-east-1",
        offerings={
            "g6.12xlarge": ["us-east-1e", "us-east-1f"],
            "m7i.xlarge": ["us-east-1a", "us-east-1e", "us-east-1f"],
        },
    )
    _, gpu_az, cluster_azs = place(fake)
    assert (gpu_az, cluster_azs) == ("us-east-1f", ["us-east-1f", "us-east-1a"])  # us-east-1e is use1-az3


def test_automatic_zone_skips_zones_without_the_system_type():
    fake = FakeAws(offerings={"m7i.xlarge": ["us-east-2b", "us-east-2c"]})
    _, gpu_az, cluster_azs = place(fake)
    assert (gpu_az, cluster_azs) == ("us-east-2b", ["us-east-2b", "us-east-2c"])


def test_configured_gpu_zone_is_kept_and_listed_first():
    _, gpu_az, cluster_azs = place(FakeAws(), gpuAz="us-east-2c")
    assert (gpu_az, cluster_azs) == ("us-east-2c", ["us-east-2c", "us-east-2a"])


def test_reservation_zone_becomes_the_gpu_zone():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2c")})
    placement, gpu_az, cluster_azs = place(fake, capacityReservationId=RESERVATION)
    assert (gpu_az, cluster_azs) == ("us-east-2c", ["us-east-2c", "us-east-2a"])
    assert placement.capacity_reservation_id == RESERVATION


def test_reservation_agrees_with_a_configured_gpu_zone():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    _, gpu_az, _ = place(fake, capacityReservationId=RESERVATION, gpuAz="us-east-2b")
    assert gpu_az == "us-east-2b"


def test_offered_type_that_aws_cannot_describe_names_the_key():
    message = refusal(
        FakeAws(offerings={"g9.12xlarge": ["us-east-2a"]}), ConfigError, gpuNodeType="g9.12xlarge"
    )
    assert "config key 'gpuNodeType' = 'g9.12xlarge'" in message
    assert "InvalidInstanceType" in message
