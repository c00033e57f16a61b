"""Preflight under Pulumi mocks: the zones it picks, and the message of every way it refuses."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pulumi
import pytest

from infra import preflight
from infra.config.stack import ConfigError, parse_settings
from infra.preflight import (
    Placement,
    PreflightError,
    gpu_subnet_shortfall,
    kubernetes_version_problem,
    plan_placement,
)
from tests.harness.fake_aws import (
    ACCOUNT_ID,
    EKS_VERSIONS,
    FakeAws,
    FakeAwsMocks,
    capacity_block,
    capacity_reservation,
)
from tests.harness.program import dev_config, run_program

RESERVATION = "cr-0123456789abcdef0"
QUOTA_TOKEN = "aws:servicequotas/getServiceQuota:getServiceQuota"
CLOUD_CONTROL_TOKEN = "aws:cloudcontrol/getResource:getResource"
# The time of every preview here: reservation dates are set against it.
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


class RecordingMocks(FakeAwsMocks):
    """Also records every resource the code under test registers or reads: the preflight must do neither."""

    def __init__(self, aws: FakeAws):
        super().__init__(aws)
        self.registered: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        self.registered.append(f"{args.typ} {args.name}")
        return super().new_resource(args)


def plan(fake: FakeAws, now: datetime = NOW, **config) -> tuple[Placement, str, list[str]]:
    """Run `plan_placement` in a mocked `pulumi preview`; return the placement and its zones.

    Fails the test when the preflight registered or read any resource, whether it passed or refused.
    """
    mocks = RecordingMocks(fake)
    pulumi.runtime.set_mocks(mocks, project="eks-ray-train", stack="dev", preview=True)
    settings = parse_settings({"endpointPublicAccessCidrs": ["203.0.113.7/32"], **config}, fake.region)
    planned: list[Placement] = []

    @pulumi.runtime.test
    def run():
        planned.append(plan_placement(settings, lambda: now))

    try:
        run()
    finally:
        assert mocks.registered == [], f"the preflight registered {mocks.registered}"
    placement = planned[0]
    return placement, placement.gpu_az, placement.cluster_azs


def refusal(fake: FakeAws, error: type[Exception] = PreflightError, **config) -> str:
    with pytest.raises(error) as caught:
        plan(fake, **config)
    return str(caught.value)


# --- the passing cases ----------------------------------------------------------------------------


def test_default_stack_gets_first_zone_and_a_second_for_the_control_plane():
    fake = FakeAws()
    placement, gpu_az, cluster_azs = plan(fake)
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
    _, gpu_az, cluster_azs = plan(fake)
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
    _, gpu_az, cluster_azs = plan(fake)
    assert (gpu_az, cluster_azs) == ("us-east-1f", ["us-east-1f", "us-east-1a"])  # us-east-1e is use1-az3


def test_automatic_zone_skips_zones_without_the_system_type():
    fake = FakeAws(offerings={"m7i.xlarge": ["us-east-2b", "us-east-2c"]})
    _, gpu_az, cluster_azs = plan(fake)
    assert (gpu_az, cluster_azs) == ("us-east-2b", ["us-east-2b", "us-east-2c"])


def test_configured_gpu_zone_is_kept_and_listed_first():
    _, gpu_az, cluster_azs = plan(FakeAws(), gpuAz="us-east-2c")
    assert (gpu_az, cluster_azs) == ("us-east-2c", ["us-east-2c", "us-east-2a"])


def test_reservation_zone_becomes_the_gpu_zone():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2c")})
    placement, gpu_az, cluster_azs = plan(fake, capacityReservationId=RESERVATION)
    assert (gpu_az, cluster_azs) == ("us-east-2c", ["us-east-2c", "us-east-2a"])
    assert placement.capacity_reservation_id == RESERVATION


def test_reservation_agrees_with_a_configured_gpu_zone():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    _, gpu_az, _ = plan(fake, capacityReservationId=RESERVATION, gpuAz="us-east-2b")
    assert gpu_az == "us-east-2b"


def test_type_without_a_known_vcpu_quota_is_reported_not_blocked(caplog, monkeypatch):
    """A family the quota table does not know yet (Mac types, the table's one family without a vCPU
    quota, are refused earlier for their architecture): the preview warns and goes on."""
    caplog.set_level(logging.WARNING)
    known = preflight.on_demand_vcpu_quota
    monkeypatch.setattr(
        preflight, "on_demand_vcpu_quota", lambda name: None if name == "m7i.xlarge" else known(name)
    )
    _, gpu_az, _ = plan(FakeAws())
    assert gpu_az == "us-east-2a"
    assert "no On-Demand vCPU quota is known for m7i.xlarge" in caplog.text


# --- offerings and zones --------------------------------------------------------------------------


def test_gpu_type_not_sold_in_the_region():
    message = refusal(FakeAws(region="eu-west-1"))
    assert "config key 'gpuNodeType' = 'g6.12xlarge' is not offered in any zone of eu-west-1" in message
    assert "python -m infra.region_survey --regions eu-west-1" in message


def test_unknown_gpu_type_is_not_offered_anywhere():
    message = refusal(FakeAws(), gpuNodeType="g6.13xlarge")
    assert "config key 'gpuNodeType' = 'g6.13xlarge' is not offered in any zone of us-east-2" in message
    assert "check the name" in message


def test_offered_type_that_aws_cannot_describe_names_the_key():
    message = refusal(
        FakeAws(offerings={"g9.12xlarge": ["us-east-2a"]}), ConfigError, gpuNodeType="g9.12xlarge"
    )
    assert "config key 'gpuNodeType' = 'g9.12xlarge'" in message
    assert "InvalidInstanceType" in message


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


# --- EFA and quotas -------------------------------------------------------------------------------


def test_gpu_type_without_efa():
    message = refusal(FakeAws(), gpuNodeType="g6.xlarge")
    assert "config key 'gpuNodeType' = 'g6.xlarge' does not support EFA" in message


def test_gpu_quota_too_small_gives_numbers_and_the_request_command():
    message = refusal(FakeAws(quotas={"L-DB2E81BA": 64}))
    assert "'Running On-Demand G and VT instances' (L-DB2E81BA) in us-east-2 is 64" in message
    assert "2 x g6.12xlarge (48 vCPU each) need 96" in message
    assert (
        "`aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA "
        "--desired-value 96 --region us-east-2`" in message
    )
    assert "vCPUs of instances already running in the region count against it too" in message


def test_quota_exactly_covering_the_gpu_nodes_passes():
    _, gpu_az, _ = plan(FakeAws(quotas={"L-DB2E81BA": 96}))
    assert gpu_az == "us-east-2a"


def test_node_groups_sharing_a_quota_are_added_up():
    message = refusal(FakeAws(quotas={"L-DB2E81BA": 96}), systemNodeType="g4dn.xlarge")
    assert "2 x g6.12xlarge (48 vCPU each) + 1 x g4dn.xlarge (4 vCPU each) need 100" in message
    assert "--desired-value 100" in message


def test_system_node_quota_too_small():
    message = refusal(FakeAws(quotas={"L-1216C47A": 2}), systemNodeType="m7i.xlarge")
    assert "'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances' (L-1216C47A)" in message
    assert "--quota-code L-1216C47A --desired-value 4" in message


def test_quota_that_cannot_be_read_names_the_permission():
    message = refusal(FakeAws(denied={QUOTA_TOKEN}))
    assert "could not read the vCPU quota" in message
    assert "AccessDeniedException" in message
    assert "servicequotas:GetServiceQuota" in message


# --- capacity reservations ------------------------------------------------------------------------


def program_refusal(fake: FakeAws, **config) -> str:
    """Run the whole program with this reservation; it must stop before registering any resource."""
    with pytest.raises(PreflightError) as caught:
        run_program(dev_config(**config), fake)
    assert caught.value.plan.resources == []
    return str(caught.value)


def test_reservation_is_read_once_through_cloud_control_as_plain_values():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2c")})
    _, gpu_az, cluster_azs = plan(fake, capacityReservationId=RESERVATION)
    assert type(gpu_az) is str and type(cluster_azs) is list
    reads = [args for token, args in fake.calls if token == CLOUD_CONTROL_TOKEN]
    assert reads == [{"typeName": "AWS::EC2::CapacityReservation", "identifier": RESERVATION}]


def test_reservation_without_a_state_property_is_judged_by_its_available_count():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", state=None)})
    _, gpu_az, _ = plan(fake, capacityReservationId=RESERVATION)
    assert gpu_az == "us-east-2b"
    fake.reservations[RESERVATION]["availableInstanceCount"] = 0
    message = refusal(fake, capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} has 0 of its 2 g6.12xlarge instance(s) available" in message


@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_missing_reservation_names_the_key_the_id_and_the_region(run):
    message = run(FakeAws(), capacityReservationId=RESERVATION)
    assert f"config key 'capacityReservationId' = {RESERVATION}: could not read" in message
    assert f"capacity reservation {RESERVATION} in us-east-2: it does not exist there" in message
    assert "couldn't find resource" in message and "describe-capacity-reservations" in message
    assert "\n" not in message.strip()  # one line, not the nested invoke error


@pytest.mark.parametrize("state", ["pending", "expired", "cancelled"])
@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_reservation_that_is_not_active(run, state):
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", state=state)})
    message = run(fake, capacityReservationId=RESERVATION)
    assert (
        f"capacity reservation {RESERVATION} is {state}, and only an active reservation holds instances"
        in message
    )
    assert f"--capacity-reservation-ids {RESERVATION} --region us-east-2" in message


@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_reservation_for_another_type(run):
    fake = FakeAws(
        reservations={RESERVATION: capacity_reservation("us-east-2b", instance_type="g5.12xlarge")}
    )
    message = run(fake, capacityReservationId=RESERVATION)
    assert (
        f"capacity reservation {RESERVATION} reserves g5.12xlarge, and gpuNodeType is g6.12xlarge" in message
    )


def test_reservation_for_another_platform():
    fake = FakeAws(
        reservations={RESERVATION: capacity_reservation("us-east-2b", instance_platform="Windows")}
    )
    message = refusal(fake, capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} is for Windows instances" in message


def test_reservation_with_dedicated_tenancy():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", tenancy="dedicated")})
    message = refusal(fake, capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} has dedicated tenancy" in message


@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_reservation_with_too_few_available_instances_though_enough_in_total(run):
    reservation = capacity_reservation("us-east-2b", instance_count=4, available_instance_count=1)
    message = run(FakeAws(reservations={RESERVATION: reservation}), capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} has 1 of its 4 g6.12xlarge instance(s) available" in message
    assert "gpuNodeCount is 2" in message
    describe = f"`aws ec2 describe-capacity-reservations --capacity-reservation-ids {RESERVATION} --region us-east-2`"
    assert describe in message
    assert f"--capacity-reservation-id {RESERVATION} --instance-count 5 --region us-east-2" in message


def test_reservation_with_exactly_enough_available_instances_passes():
    reservation = capacity_reservation("us-east-2b", instance_count=4, available_instance_count=2)
    _, gpu_az, _ = plan(FakeAws(reservations={RESERVATION: reservation}), capacityReservationId=RESERVATION)
    assert gpu_az == "us-east-2b"


@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_reservation_in_another_zone_than_the_configured_one(run):
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2c")})
    message = run(fake, capacityReservationId=RESERVATION, gpuAz="us-east-2a")
    assert (
        f"config key 'gpuAz' = 'us-east-2a', and capacity reservation {RESERVATION} is in us-east-2c"
        in message
    )


def test_reservation_in_a_zone_eks_cannot_use():
    fake = FakeAws(
        region="us-east-1",
        reservations={RESERVATION: capacity_reservation("us-east-1e", instance_type="p5.48xlarge")},
    )
    message = refusal(fake, capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge")
    assert f"capacity reservation {RESERVATION}: us-east-1e is zone use1-az3" in message
    assert "use a capacity reservation in one of them" in message


# --- the reservation on later runs: this cluster's own nodes are in it ---------------------------
# EC2 counts every instance running in a reservation out of `AvailableInstanceCount`, this stack's
# own GPU nodes included; `FakeAws.launch_into_reservation` leaves the account as a deploy does.


def test_this_clusters_running_nodes_count_back_into_a_full_reservation():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    fake.launch_into_reservation(RESERVATION, "eks-ray-train", 2)
    placement, gpu_az, _ = plan(fake, capacityReservationId=RESERVATION)
    assert gpu_az == "us-east-2b"
    assert (placement.reservation.available, placement.reservation.own_instances) == (0, 2)
    _, args = next(call for call in fake.calls if call[0] == "aws:ec2/getInstances:getInstances")
    assert {item["name"]: item["values"] for item in args["filters"]} == {
        "capacity-reservation-id": [RESERVATION],
        "tag:eks:cluster-name": ["eks-ray-train"],
    }
    assert sorted(args["instanceStateNames"]) == ["pending", "running"]


@pytest.mark.parametrize("run", [refusal, program_refusal], ids=["preflight", "program"])
def test_another_clusters_nodes_in_the_reservation_still_count_as_used(run):
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    fake.launch_into_reservation(RESERVATION, "team-b", 2)
    message = run(fake, capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} has 0 of its 2 g6.12xlarge instance(s) available" in message
    assert "(2 in use; 2 held by others)" in message
    assert "gpuNodeCount to 0" not in message  # gpuNodeCount must be at least 1: never offered as the fix
    assert f"--capacity-reservation-id {RESERVATION} --instance-count 4 --region us-east-2" in message


def test_own_and_other_nodes_sharing_a_reservation_leave_only_the_own_ones_usable():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", instance_count=3)})
    fake.launch_into_reservation(RESERVATION, "eks-ray-train", 2)
    fake.launch_into_reservation(RESERVATION, "team-b", 1)
    assert plan(fake, capacityReservationId=RESERVATION)[1] == "us-east-2b"  # the 2 nodes it runs fit
    message = refusal(fake, capacityReservationId=RESERVATION, gpuNodeCount=3)
    assert (
        "has 0 of its 3 g6.12xlarge instance(s) available (3 in use, 2 of them by this cluster; 1 held by others)"
        in message
    )
    assert "set gpuNodeCount to 2" in message


def test_another_cluster_of_the_same_account_is_told_apart_by_its_name():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    fake.launch_into_reservation(RESERVATION, "eks-ray-train", 2)
    message = refusal(fake, capacityReservationId=RESERVATION, clusterName="eks-ray-train-2")
    assert "(2 in use; 2 held by others)" in message


def test_instances_that_cannot_be_listed_name_the_permission():
    fake = FakeAws(
        reservations={RESERVATION: capacity_reservation("us-east-2b")},
        denied={"aws:ec2/getInstances:getInstances"},
    )
    message = refusal(fake, capacityReservationId=RESERVATION)
    assert f"could not list the instances in capacity reservation {RESERVATION}" in message
    assert "ec2:DescribeInstances" in message


# --- what the reservation says about placement, market and updates -------------------------------


def test_reservation_made_in_a_cluster_placement_group_carries_its_name():
    arn = f"arn:aws:ec2:us-east-2:{ACCOUNT_ID}:placement-group/gpu-pg"
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", placement_group_arn=arn)})
    placement, _, _ = plan(fake, capacityReservationId=RESERVATION)
    assert placement.reservation.placement_group_name == "gpu-pg"


def block_in_2b(starts: timedelta, ends: timedelta) -> dict:
    return capacity_block("us-east-2b", NOW, starts, ends)


RUNNING_BLOCK = (timedelta(hours=-2), timedelta(hours=22))


def test_capacity_block_is_recognised_by_its_reservation_type():
    block = block_in_2b(*RUNNING_BLOCK)
    placement, _, _ = plan(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
    )
    assert placement.reservation.is_capacity_block
    assert placement.reservation.start_date == NOW - timedelta(hours=2)
    assert placement.reservation.end_date == NOW + timedelta(hours=22)
    assert placement.gpus_from is None  # begun: nothing to wait for


def test_an_odcr_reads_its_end_date_when_it_has_one():
    end = NOW + timedelta(days=3)
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", end_date=end)})
    assert plan(fake, capacityReservationId=RESERVATION)[0].reservation.end_date == end
    reads = [args for token, args in fake.calls if token == CLOUD_CONTROL_TOKEN]
    assert len(reads) == 1
    unlimited = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    assert plan(unlimited, capacityReservationId=RESERVATION)[0].reservation.end_date is None


def test_schema_without_reservation_type_is_taken_as_an_on_demand_reservation():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", reservation_type=None)})
    placement, _, _ = plan(fake, capacityReservationId=RESERVATION)
    assert not placement.reservation.is_capacity_block


def test_a_reservation_warns_that_it_bills_after_destroy_with_the_cancel_command(caplog):
    caplog.set_level(logging.WARNING)
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    plan(fake, capacityReservationId=RESERVATION)
    assert (
        f"capacity reservation {RESERVATION} is not part of this stack and outlives `pulumi destroy`"
        in caplog.text
    )
    assert (
        f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {RESERVATION} --region us-east-2"
        in caplog.text
    )


def test_an_ended_capacity_block_says_it_ended():
    """EC2 reclaims a Capacity Block's instances at its end and the reservation's state leaves active."""
    block = block_in_2b(timedelta(hours=-26), timedelta(hours=-2))
    assert block["state"] == "expired"
    message = refusal(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
    )
    assert message.startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': the Capacity Block is expired"
    )


def test_a_capacity_block_whose_payment_is_pending_is_refused_with_the_check():
    block = {**block_in_2b(timedelta(hours=1), timedelta(hours=25)), "state": "payment-pending"}
    message = refusal(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
    )
    assert message.startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': the Capacity Block is payment-pending, and only "
        "a scheduled or active block gets instances"
    )
    assert f"--capacity-reservation-ids {RESERVATION}" in message


def test_a_capacity_block_starting_within_the_timeout_is_waited_for(caplog):
    """Before its start EC2 shows none of its instances available: that is no shortage."""
    caplog.set_level(logging.INFO)
    block = block_in_2b(timedelta(minutes=45), timedelta(hours=24, minutes=45))
    assert (block["state"], block["availableInstanceCount"]) == ("scheduled", 0)
    placement, gpu_az, _ = plan(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
        training={"preset": "smoke", "timeoutMinutes": 45},
    )
    assert gpu_az == "us-east-2b"
    assert placement.gpus_from == NOW + timedelta(minutes=45)
    assert (
        f"capacity reservation {RESERVATION} is a Capacity Block that starts at 2026-12-05T09:45:00Z, in 45 min: "
        "its GPU nodes launch then (the training run waits for it, then for the nodes)"
    ) in caplog.text


def test_a_capacity_block_starting_after_the_timeout_is_refused_with_its_start():
    block = block_in_2b(timedelta(minutes=46), timedelta(hours=24, minutes=46))
    message = refusal(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
        training={"preset": "smoke", "timeoutMinutes": 45},
    )
    assert message == (
        f"config key 'capacityReservationId' = '{RESERVATION}': the Capacity Block starts at 2026-12-05T09:46:00Z, "
        "in 46 min, and `pulumi up` waits for it at most training.timeoutMinutes (45 min): run `pulumi up` after "
        "2026-12-05T09:01:00Z, or set training.timeoutMinutes to 46 or more"
    )


def test_without_a_training_run_a_later_capacity_block_is_accepted(caplog):
    """Nothing waits: EKS's node group launches the nodes when the block becomes active."""
    caplog.set_level(logging.INFO)
    block = block_in_2b(timedelta(days=2), timedelta(days=3))
    placement, _, _ = plan(
        FakeAws(reservations={RESERVATION: block}),
        capacityReservationId=RESERVATION,
        gpuNodeType="p5.48xlarge",
        train=False,
    )
    assert placement.gpus_from == NOW + timedelta(days=2)
    assert "in 48 h 00 min: its GPU nodes launch then (no training run waits)" in caplog.text


def test_a_scheduled_odcr_is_no_capacity_block_and_stays_refused():
    """Only a Capacity Block's start is waited for; a future-dated ODCR is judged when active."""
    reservation = capacity_reservation("us-east-2b", state="scheduled", start_date=NOW + timedelta(minutes=5))
    message = refusal(FakeAws(reservations={RESERVATION: reservation}), capacityReservationId=RESERVATION)
    assert f"capacity reservation {RESERVATION} is scheduled, and only an active reservation holds" in message


def test_running_capacity_block_warns_that_aws_updates_it_only_at_size_zero(caplog):
    caplog.set_level(logging.WARNING)
    block = block_in_2b(*RUNNING_BLOCK)
    fake = FakeAws(reservations={RESERVATION: block})
    fake.launch_into_reservation(RESERVATION, "eks-ray-train", 2)
    plan(fake, capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge")
    assert (
        "is a Capacity Block, and AWS supports updating a managed node group of a Capacity Block only at desired size 0"
        in caplog.text
    )


# --- architecture and Kubernetes version ------------------------------------------------------------


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


def test_a_kubernetes_version_eks_does_not_offer_is_refused_with_the_offered_ones():
    message = refusal(FakeAws(), ConfigError, kubernetesVersion="1.29")
    assert message == (
        "config key 'kubernetesVersion' = '1.29': EKS offers "
        f"{', '.join(sorted(EKS_VERSIONS, key=lambda v: tuple(map(int, v.split('.')))))} here: pick one of them"
    )


def test_a_version_in_extended_support_is_planned_with_a_warning(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    plan(FakeAws(), kubernetesVersion="1.33")
    assert any("1.33 is in EKS extended support" in warning for warning in warnings)


def test_the_version_check_is_skipped_with_a_warning_when_eks_refuses_to_answer(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    plan(FakeAws(denied={"aws:eks/getClusterVersions:getClusterVersions"}))
    assert any(warning.startswith("kubernetesVersion 1.36 was not checked") for warning in warnings)


def test_kubernetes_version_judgement():
    offered = {"1.36": "STANDARD_SUPPORT", "1.33": "EXTENDED_SUPPORT", "1.28": "UNSUPPORTED"}
    assert kubernetes_version_problem("1.36", offered) is None
    assert kubernetes_version_problem("1.33", offered) is None
    assert kubernetes_version_problem("1.28", offered) == "EKS offers 1.33, 1.36 here: pick one of them"
    assert kubernetes_version_problem("1.40", offered) == "EKS offers 1.33, 1.36 here: pick one of them"


# --- the GPU subnet's addresses ---------------------------------------------------------------------


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
    _, gpu_az, _ = plan(fake, vpcCidr="10.0.0.0/16", gpuNodeCount=3)
    assert gpu_az == "us-east-1d"
