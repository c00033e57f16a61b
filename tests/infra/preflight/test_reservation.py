"""The capacity reservation: read through Cloud Control, judged against the settings, this\ncluster's own nodes counted back, what a Capacity Block means for the run and for updates."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from infra.preflight import PreflightError
from tests.harness.fake_aws import ACCOUNT_ID, FakeAws, capacity_block, capacity_reservation
from tests.harness.preflight_run import NOW, RESERVATION, place, refusal
from tests.harness.program import dev_config, run_program

CLOUD_CONTROL_TOKEN = "aws:cloudcontrol/getResource:getResource"


def program_refusal(fake: FakeAws, **config) -> str:
    """Run the whole program with this reservation; it must stop before registering any resource."""
    with pytest.raises(PreflightError) as caught:
        run_program(dev_config(**config), fake)
    assert caught.value.plan.resources == []
    return str(caught.value)


def test_reservation_is_read_once_through_cloud_control_as_plain_values():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2c")})
    _, gpu_az, cluster_azs = place(fake, capacityReservationId=RESERVATION)
    assert type(gpu_az) is str and type(cluster_azs) is list
    reads = [args for token, args in fake.calls if token == CLOUD_CONTROL_TOKEN]
    assert reads == [{"typeName": "AWS::EC2::CapacityReservation", "identifier": RESERVATION}]


def test_reservation_without_a_state_property_is_judged_by_its_available_count():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", state=None)})
    _, gpu_az, _ = place(fake, capacityReservationId=RESERVATION)
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
    _, gpu_az, _ = place(FakeAws(reservations={RESERVATION: reservation}), capacityReservationId=RESERVATION)
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


def test_this_clusters_running_nodes_count_back_into_a_full_reservation():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    fake.launch_into_reservation(RESERVATION, "eks-ray-train", 2)
    placement, gpu_az, _ = place(fake, capacityReservationId=RESERVATION)
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
    assert place(fake, capacityReservationId=RESERVATION)[1] == "us-east-2b"  # the 2 nodes it runs fit
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
    placement, _, _ = place(fake, capacityReservationId=RESERVATION)
    assert placement.reservation.placement_group_name == "gpu-pg"


def block_in_2b(starts: timedelta, ends: timedelta) -> dict:
    return capacity_block("us-east-2b", NOW, starts, ends)


RUNNING_BLOCK = (timedelta(hours=-2), timedelta(hours=22))


def test_capacity_block_is_recognised_by_its_reservation_type():
    block = block_in_2b(*RUNNING_BLOCK)
    placement, _, _ = place(
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
    assert place(fake, capacityReservationId=RESERVATION)[0].reservation.end_date == end
    reads = [args for token, args in fake.calls if token == CLOUD_CONTROL_TOKEN]
    assert len(reads) == 1
    unlimited = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    assert place(unlimited, capacityReservationId=RESERVATION)[0].reservation.end_date is None


def test_schema_without_reservation_type_is_taken_as_an_on_demand_reservation():
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b", reservation_type=None)})
    placement, _, _ = place(fake, capacityReservationId=RESERVATION)
    assert not placement.reservation.is_capacity_block


def test_a_reservation_warns_that_it_bills_after_destroy_with_the_cancel_command(caplog):
    caplog.set_level(logging.WARNING)
    fake = FakeAws(reservations={RESERVATION: capacity_reservation("us-east-2b")})
    place(fake, capacityReservationId=RESERVATION)
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
    placement, gpu_az, _ = place(
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
    placement, _, _ = place(
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
    place(fake, capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge")
    assert (
        "is a Capacity Block, and AWS supports updating a managed node group of a Capacity Block only at desired size 0"
        in caplog.text
    )
