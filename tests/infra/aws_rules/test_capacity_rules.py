"""The pure capacity judgements that preflight and the region finder share."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from infra.aws_rules.capacity_rules import (
    CAPACITY_BLOCK,
    ReservationFacts,
    ReservationMisfit,
    has_efa,
    reservation_misfit,
    usable_zones,
    vcpu_shortfall,
)

RESERVATION = ReservationFacts(
    reservation_id="cr-0123456789abcdef0",
    instance_type="g6.12xlarge",
    platform="Linux/UNIX",
    tenancy="default",
    zone="us-east-2b",
    state="active",
    total=2,
    available=2,
    own_instances=0,
)


def test_efa_needs_support_and_an_interface():
    assert has_efa(True, 1) and not has_efa(True, 0) and not has_efa(False, 0)


def test_usable_zones_leave_out_zones_without_an_eks_control_plane_and_sort_by_name():
    zone_ids = {"us-east-1f": "use1-az5", "us-east-1e": "use1-az3", "us-east-1a": "use1-az6"}
    assert usable_zones(["us-east-1f", "us-east-1e", "us-east-1a", "us-east-1a"], zone_ids) == [
        "us-east-1a",
        "us-east-1f",
    ]


def test_vcpu_shortfall_counts_what_already_runs():
    assert vcpu_shortfall(192, 0, 96) == 0
    assert vcpu_shortfall(192, 100, 96) == 4


def test_reservation_holds_what_is_available_plus_this_clusters_own_instances():
    full_of_ours = dataclasses.replace(RESERVATION, available=0, own_instances=2)
    assert reservation_misfit(full_of_ours, "g6.12xlarge", 2) is None
    full_of_others = dataclasses.replace(RESERVATION, available=0)
    assert reservation_misfit(full_of_others, "g6.12xlarge", 2) is ReservationMisfit.TOO_FEW


@pytest.mark.parametrize(
    "change, misfit",
    [
        ({"state": "expired", "instance_type": "g5.12xlarge"}, ReservationMisfit.NOT_ACTIVE),
        ({"instance_type": "g5.12xlarge", "platform": "Windows"}, ReservationMisfit.INSTANCE_TYPE),
        ({"platform": "Windows", "tenancy": "dedicated"}, ReservationMisfit.PLATFORM),
        ({"tenancy": "dedicated", "available": 0}, ReservationMisfit.TENANCY),
        ({"state": None}, None),
    ],
)
def test_reservation_misfits_in_order(change, misfit):
    assert reservation_misfit(dataclasses.replace(RESERVATION, **change), "g6.12xlarge", 2) is misfit


def test_a_capacity_block_not_begun_is_judged_as_it_will_be_a_scheduled_odcr_is_not():
    """Before its start EC2 shows a block's available count as 0 (EC2 user guide, "View Capacity Blocks")."""
    start = datetime(2026, 12, 5, 11, 30, tzinfo=UTC)
    block = dataclasses.replace(
        RESERVATION, state="scheduled", available=0, reservation_type=CAPACITY_BLOCK, start_date=start
    )
    assert block.awaits_start and reservation_misfit(block, "g6.12xlarge", 2) is None
    odcr = dataclasses.replace(block, reservation_type="default")
    assert (
        not odcr.awaits_start and reservation_misfit(odcr, "g6.12xlarge", 2) is ReservationMisfit.NOT_ACTIVE
    )
    paying = dataclasses.replace(block, state="payment-pending")
    assert reservation_misfit(paying, "g6.12xlarge", 2) is ReservationMisfit.NOT_ACTIVE


def test_placement_group_name_comes_from_the_reservations_arn():
    arn = "arn:aws:ec2:us-east-2:123456789012:placement-group/gpu-pg"
    assert dataclasses.replace(RESERVATION, placement_group_arn=arn).placement_group_name == "gpu-pg"
    assert RESERVATION.placement_group_name is None
