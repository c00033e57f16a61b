"""The capacity judgements, pure functions over instance, zone, quota and reservation facts.

`infra.preflight` (Pulumi invokes, in `pulumi preview`) and `infra.region_survey` (boto3, before a
stack exists) each fetch these facts their own way and word the judgements for their reader;
what each judgement is lives only here. Nothing here calls AWS or imports Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

# Zone IDs where EKS does not place cluster control planes (EKS user guide, "Subnet requirements").
EKS_UNSUPPORTED_ZONE_IDS = ("use1-az3", "usw1-az2", "cac1-az3")

# `ReservationType` of a Capacity Block for ML (EC2 `DescribeCapacityReservations`; Cloud Control
# returns the same value under the CloudFormation property of that name). The other value is `default`.
CAPACITY_BLOCK = "capacity-block"


def has_efa(efa_supported: bool, efa_interfaces: int) -> bool:
    """NCCL can use EFA between the nodes: the type supports EFA and takes at least one EFA interface."""
    return efa_supported and efa_interfaces >= 1


def eks_zones(zone_ids: Mapping[str, str]) -> dict[str, str]:
    """Zone name -> zone ID of the zones where EKS can place a control plane subnet."""
    return {zone: zone_id for zone, zone_id in zone_ids.items() if zone_id not in EKS_UNSUPPORTED_ZONE_IDS}


def usable_zones(offered: Iterable[str], zone_ids: Mapping[str, str]) -> list[str]:
    """Zones, sorted by name, that offer the type and where EKS can place a control plane subnet."""
    eks = eks_zones(zone_ids)
    return sorted(zone for zone in set(offered) if zone in eks)


def vcpu_shortfall(quota_vcpus: float, used_vcpus: float, needed_vcpus: float) -> float:
    """vCPUs missing under a quota once `used_vcpus` already run against it; 0 when the nodes fit."""
    return max(0.0, needed_vcpus - (quota_vcpus - used_vcpus))


@dataclass(frozen=True)
class ReservationFacts:
    """An EC2 capacity reservation as AWS describes it, plus what of it this cluster already holds.

    `own_instances`: instances of this stack's cluster pending or running in the reservation.
    They are counted out of `available` by EC2 but are the very nodes this stack keeps, so
    they are usable to it. `state` and `reservation_type` are None where the source omits them.
    `start_date` and `end_date` are AWS's `StartDate` and `EndDate` (a reservation without an end
    date has none: `EndDateType` `unlimited`).
    """

    reservation_id: str
    instance_type: str
    platform: str
    tenancy: str | None
    zone: str
    state: str | None
    total: int
    available: int
    own_instances: int
    placement_group_arn: str | None = None
    reservation_type: str | None = None
    start_date: datetime | None = None
    end_date: datetime | None = None

    @property
    def usable(self) -> int:
        """Instances this stack may run in the reservation: the free ones plus the ones it already runs."""
        return self.available + self.own_instances

    @property
    def is_capacity_block(self) -> bool:
        return self.reservation_type == CAPACITY_BLOCK

    @property
    def awaits_start(self) -> bool:
        """A Capacity Block paid for and not started yet (`scheduled`), which EC2 makes `active` at
        its start date (EC2 user guide, "View Capacity Blocks")."""
        return self.is_capacity_block and self.state == "scheduled" and self.start_date is not None

    @property
    def placement_group_name(self) -> str | None:
        """Name of the cluster placement group the reservation was created in (ARN `...:placement-group/<name>`)."""
        if not self.placement_group_arn:
            return None
        return self.placement_group_arn.rsplit("/", 1)[-1]


class ReservationMisfit(Enum):
    """Why a reservation cannot hold the GPU nodes; the first that applies, in this order."""

    NOT_ACTIVE = "not-active"
    INSTANCE_TYPE = "instance-type"
    PLATFORM = "platform"
    TENANCY = "tenancy"
    TOO_FEW = "too-few"


def reservation_misfit(
    reservation: ReservationFacts, instance_type: str, count: int
) -> ReservationMisfit | None:
    """None when `count` nodes of `instance_type` (Linux, default tenancy) can run in the reservation.

    A Capacity Block that has not started is judged as it will be: EC2 shows 0 of its instances
    available until its start (EC2 user guide, "View Capacity Blocks"), so its count is not judged;
    whether the run may wait for its start is `reservation_window.start_wait_problem`'s to say."""
    if reservation.state not in (None, "active") and not reservation.awaits_start:
        return ReservationMisfit.NOT_ACTIVE
    if reservation.instance_type != instance_type:
        return ReservationMisfit.INSTANCE_TYPE
    if reservation.platform != "Linux/UNIX":
        return ReservationMisfit.PLATFORM
    if reservation.tenancy not in (None, "default"):
        return ReservationMisfit.TENANCY
    if reservation.usable < count and not reservation.awaits_start:
        return ReservationMisfit.TOO_FEW
    return None


# --- On-Demand vCPU quotas: which Service Quotas code an instance type draws on ------------------


@dataclass(frozen=True)
class VcpuQuota:
    """An EC2 On-Demand vCPU quota of Service Quotas, shared by every instance of its class in a region."""

    code: str
    name: str


STANDARD_QUOTA = VcpuQuota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
_QUOTAS_BY_PREFIX = {
    "g": VcpuQuota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "p": VcpuQuota("L-417A185B", "Running On-Demand P instances"),
    "inf": VcpuQuota("L-1945791B", "Running On-Demand Inf instances"),
    "trn": VcpuQuota("L-2C3B7624", "Running On-Demand Trn instances"),
    "dl": VcpuQuota("L-6E869C2A", "Running On-Demand DL instances"),
    "f": VcpuQuota("L-74FC7D96", "Running On-Demand F instances"),
    "x": VcpuQuota("L-7295265B", "Running On-Demand X instances"),
    "u": VcpuQuota("L-43DA4232", "Running On-Demand High Memory instances"),
    "hpc": VcpuQuota("L-F7808C92", "Running On-Demand HPC instances"),
}
_QUOTAS_BY_PREFIX["gr"] = _QUOTAS_BY_PREFIX["vt"] = _QUOTAS_BY_PREFIX["g"]
_STANDARD_LETTERS = "acdhimrtz"
# Mac instances run only on Dedicated Hosts, which have per-family host quotas instead.
_NO_VCPU_QUOTA = ("mac",)


def on_demand_vcpu_quota(instance_type: str) -> VcpuQuota | None:
    """The On-Demand vCPU quota that running `instance_type` draws on, None for classes without one."""
    letters = re.match(r"[a-z]+", instance_type)
    prefix = letters.group() if letters else ""
    if prefix in _QUOTAS_BY_PREFIX:
        return _QUOTAS_BY_PREFIX[prefix]
    if prefix and prefix not in _NO_VCPU_QUOTA and prefix[0] in _STANDARD_LETTERS:
        return STANDARD_QUOTA
    return None


def quota_increase_command(quota: VcpuQuota, desired: int, region: str) -> str:
    return (
        f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota.code} "
        f"--desired-value {desired} --region {region}"
    )
