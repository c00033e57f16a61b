"""The capacity reservation (`capacityReservationId`): read, checked against the settings, and its
zone made the GPU zone.

It must exist, be `active` (or be a Capacity Block `scheduled` to start within
`training.timeoutMinutes`, which the training run waits for), reserve the GPU type for Linux/UNIX
with default tenancy, and hold `gpuNodeCount` instances.

It can hold its available instances plus the ones this cluster already runs in it: EC2 counts this
stack's own GPU nodes as used, so without adding them back every `pulumi up` after the first would
be refused. They are found with `ec2:DescribeInstances`, filtered on the reservation, the
`eks:cluster-name` tag that EKS puts on the instances of a managed node group, and the states
pending and running; another cluster's instances stay counted as used.

pulumi-aws has no data source for capacity reservations, and its `aws.ec2.CapacityReservation`
resource lacks the state and the available count, so the reservation is read through Cloud Control
(`aws.cloudcontrol.get_resource`), which returns the CloudFormation properties of
`AWS::EC2::CapacityReservation`. Older versions of that schema carry no `State`: then the state
cannot be read here, and the check relies on `AvailableInstanceCount` alone. The same read gives
`PlacementGroupArn` (the cluster placement group the reservation was created in, which the GPU
launch template then targets) and `ReservationType` (`capacity-block` for a Capacity Block for
ML, which the node group must launch as such); without them the reservation is taken as a plain
On-Demand Capacity Reservation outside any placement group.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta

import pulumi
import pulumi_aws as aws

from infra.aws_rules.capacity_rules import (
    ReservationFacts,
    ReservationMisfit,
    reservation_misfit,
)
from infra.aws_rules.reservation_window import (
    parse_aws_time,
    seconds_until,
    utc_text,
)
from infra.config.stack import StackSettings
from infra.preflight.errors import PreflightError
from infra.preflight.spans import span
from infra.preflight.zones import Zones


def read_reservation_facts(reservation_id: str, settings: StackSettings) -> ReservationFacts:
    """The reservation's facts: its Cloud Control properties and this cluster's instances in it."""
    found = _read_reservation(reservation_id, settings.region)
    return ReservationFacts(
        reservation_id=reservation_id,
        instance_type=found["InstanceType"],
        platform=found["InstancePlatform"],
        tenancy=found.get("Tenancy"),
        zone=found["AvailabilityZone"],
        state=found.get("State"),
        total=found["TotalInstanceCount"],
        available=found["AvailableInstanceCount"],
        own_instances=_own_instances(reservation_id, settings),
        placement_group_arn=found.get("PlacementGroupArn"),
        reservation_type=found.get("ReservationType"),
        start_date=parse_aws_time(found["StartDate"]) if found.get("StartDate") else None,
        end_date=parse_aws_time(found["EndDate"]) if found.get("EndDate") else None,
    )


def _own_instances(reservation_id: str, settings: StackSettings) -> int:
    """Instances of this stack's EKS cluster pending or running in the reservation."""
    try:
        found = aws.ec2.get_instances(
            filters=[
                {"name": "capacity-reservation-id", "values": [reservation_id]},
                {"name": "tag:eks:cluster-name", "values": [settings.cluster_name]},
            ],
            instance_state_names=["pending", "running"],
        )
    except (
        Exception
    ) as err:  # the provider reports API failures (e.g. UnauthorizedOperation) as an invoke error
        raise PreflightError(
            f"could not list the instances in capacity reservation {reservation_id} in {settings.region} ({err}): "
            "allow ec2:DescribeInstances to the identity running Pulumi"
        ) from None
    return len(found.ids)


def reservation_gpu_zone(
    settings: StackSettings, reservation: ReservationFacts, zones: Zones, now: datetime
) -> str:
    """Check the reservation against the settings and return its zone as the GPU zone."""
    reservation_id = reservation.reservation_id
    describe_command = f"aws ec2 describe-capacity-reservations --capacity-reservation-ids {reservation_id} --region {settings.region}"
    misfit = reservation_misfit(reservation, settings.gpu_node_type, settings.gpu_node_count)
    if (
        misfit is ReservationMisfit.NOT_ACTIVE
        and reservation.state == "expired"
        and reservation.is_capacity_block
    ):
        raise PreflightError(
            f"config key 'capacityReservationId' = {reservation_id!r}: the Capacity Block is expired; "
            "at its end EC2 reclaims the instances and the GPU node group keeps no nodes: buy a new block and set "
            "capacityReservationId to it, or remove the key to run On-Demand"
        )
    if misfit is ReservationMisfit.NOT_ACTIVE and reservation.is_capacity_block:
        raise PreflightError(
            f"config key 'capacityReservationId' = {reservation_id!r}: the Capacity Block is {reservation.state}, and "
            f"only a scheduled or active block gets instances: check it with `{describe_command}`, set "
            "capacityReservationId to another block, or remove the key to run On-Demand"
        )
    if misfit is ReservationMisfit.NOT_ACTIVE:
        raise PreflightError(
            f"capacity reservation {reservation_id} is {reservation.state}, and only an active reservation holds "
            f"instances: use an active reservation (check with `{describe_command}`), or remove capacityReservationId"
        )
    if misfit is ReservationMisfit.INSTANCE_TYPE:
        raise PreflightError(
            f"capacity reservation {reservation_id} reserves {reservation.instance_type}, and gpuNodeType is "
            f"{settings.gpu_node_type}: set gpuNodeType to {reservation.instance_type}, or use a reservation for "
            f"{settings.gpu_node_type}"
        )
    if misfit is ReservationMisfit.PLATFORM:
        raise PreflightError(
            f"capacity reservation {reservation_id} is for {reservation.platform} instances, and EKS nodes "
            "run Linux/UNIX: use a Linux/UNIX reservation"
        )
    if misfit is ReservationMisfit.TENANCY:
        raise PreflightError(
            f"capacity reservation {reservation_id} has {reservation.tenancy} tenancy, and the GPU nodes launch with "
            "default tenancy: use a reservation with default tenancy"
        )
    if misfit is ReservationMisfit.TOO_FEW:
        raise PreflightError(_too_few_message(settings, reservation, describe_command))
    if settings.gpu_az and settings.gpu_az != reservation.zone:
        raise PreflightError(
            f"config key 'gpuAz' = {settings.gpu_az!r}, and capacity reservation {reservation_id} is in "
            f"{reservation.zone}: remove gpuAz (the reservation decides the GPU zone) or set it to {reservation.zone}"
        )
    if reservation.awaits_start:
        _check_the_wait(settings, reservation, now)
    _warn_about_updates(reservation)
    _warn_about_billing(reservation, settings.region)
    return zones.check_gpu_zone(
        reservation.zone,
        f"capacity reservation {reservation_id}",
        "use a capacity reservation in one of them",
    )


def _too_few_message(settings: StackSettings, reservation: ReservationFacts, describe_command: str) -> str:
    held = f", {reservation.own_instances} of them by this cluster" if reservation.own_instances else ""
    others = reservation.total - reservation.usable
    fixes = [
        f"free or add instances (see `{describe_command}`; grow it with `aws ec2 modify-capacity-reservation "
        f"--capacity-reservation-id {reservation.reservation_id} --instance-count "
        f"{reservation.total + settings.gpu_node_count - reservation.usable} --region {settings.region}`)"
    ]
    if reservation.usable >= 1:
        fixes.append(f"set gpuNodeCount to {reservation.usable}")
    return (
        f"capacity reservation {reservation.reservation_id} has {reservation.available} of its {reservation.total} "
        f"{reservation.instance_type} instance(s) available ({reservation.total - reservation.available} in use{held}; "
        f"{others} held by others), and gpuNodeCount is {settings.gpu_node_count}: {', or '.join(fixes)}"
    )


def _check_the_wait(settings: StackSettings, reservation: ReservationFacts, now: datetime) -> None:
    """A Capacity Block not begun yet: its node group can be created now and gets its nodes at the
    block's start (EKS user guide, "Create a managed node group with Capacity Blocks for ML": the
    Auto Scaling group's launches fail until the block is active, then scale it to its desired
    size). The training run waits for the start, but no longer than `training.timeoutMinutes`."""
    start = reservation.start_date
    assert start is not None  # awaits_start
    wait_s = seconds_until(start, now)
    timeout = settings.training.timeout_minutes
    if settings.train and wait_s > timeout * 60:
        raise PreflightError(
            f"config key 'capacityReservationId' = {reservation.reservation_id!r}: the Capacity Block starts at "
            f"{utc_text(start)}, in {span(wait_s)}, and `pulumi up` waits for it at most training.timeoutMinutes "
            f"({timeout} min): run `pulumi up` after {utc_text(start - timedelta(minutes=timeout))}, or set "
            f"training.timeoutMinutes to {math.ceil(wait_s / 60)} or more"
        )
    waits = "the training run waits for it, then for the nodes" if settings.train else "no training run waits"
    pulumi.log.info(
        f"capacity reservation {reservation.reservation_id} is a Capacity Block that starts at {utc_text(start)}, "
        f"in {span(wait_s)}: its GPU nodes launch then ({waits})"
    )


def _warn_about_updates(reservation: ReservationFacts) -> None:
    """Say in the preview what an update of the GPU node group will do in this Capacity Block."""
    if reservation.own_instances and reservation.is_capacity_block:
        pulumi.log.warn(
            f"capacity reservation {reservation.reservation_id} is a Capacity Block, and AWS supports updating a "
            "managed node group of a Capacity Block only at desired size 0: a change that rolls the GPU nodes "
            "(launch template, AMI release) fails while they run; `pulumi destroy` the stack or wait for the "
            "block to end before such a change"
        )


def _warn_about_billing(reservation: ReservationFacts, region: str) -> None:
    """The stack launches into the reservation but does not own it: `pulumi destroy` ends no billing."""
    if reservation.is_capacity_block:
        ending = "a Capacity Block is paid up front and ends at its end date; it cannot be cancelled"
    else:
        ending = (
            "it bills every reserved instance-hour, used or not, until you cancel it: "
            f"`aws ec2 cancel-capacity-reservation --capacity-reservation-id {reservation.reservation_id} --region {region}`"
        )
    pulumi.log.warn(
        f"capacity reservation {reservation.reservation_id} is not part of this stack and outlives `pulumi destroy`: {ending}"
    )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _read_reservation(reservation_id: str, region: str) -> dict:
    """The reservation's CloudFormation properties (`InstanceType`, `AvailableInstanceCount`, ...) via Cloud Control."""
    try:
        result = aws.cloudcontrol.get_resource(
            type_name="AWS::EC2::CapacityReservation", identifier=reservation_id
        )
    except Exception as err:  # the provider reports a missing reservation and AccessDenied as an invoke error
        where = f"config key 'capacityReservationId' = {reservation_id}"
        listing = f"`aws ec2 describe-capacity-reservations --region {region}` lists them"
        # The provider reports Cloud Control's ResourceNotFoundException as "couldn't find resource".
        if "couldn't find resource" in str(err) or "ResourceNotFoundException" in str(err):
            raise PreflightError(
                f"{where}: could not read capacity reservation {reservation_id} in {region}: it does not exist "
                f"there (Cloud Control: couldn't find resource); check the id and the region ({listing})"
            ) from None
        raise PreflightError(
            f"{where}: could not read capacity reservation {reservation_id} in {region} "
            f"({_first_line(str(err))}): allow cloudcontrol:GetResource and ec2:DescribeCapacityReservations "
            f"to the identity running Pulumi, and check the id and the region ({listing})"
        ) from None
    return json.loads(result.properties)
