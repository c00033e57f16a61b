"""Preflight: can this account and region host the stack, and in which zones? Answered in `pulumi preview`.

Every check goes through the AWS provider (invokes, and one resource read), so it runs in
`pulumi preview` with the user's own provider settings and fails with a message that names
the cause and the fix:

- the GPU type is offered in a zone of the region EKS can use, and the system type in two of
  them (the EKS control plane needs subnets in two zones; the system nodes run in both);
- the GPU type supports EFA (its EFA interface and network card counts travel in `Placement.gpu_node`);
- the On-Demand vCPU quota of each instance class covers the node groups (`gpuNodeCount x vCPU`,
  96 for 2 x g6.12xlarge). The invoke returns the quota, not what already runs against it, so
  instances running in the region can still take the room: `python -m infra.capacity` shows usage;
- a capacity reservation (`capacityReservationId`) exists, reserves the GPU type for Linux/UNIX
  with default tenancy, holds `gpuNodeCount` instances, and decides the GPU zone.

What the reservation read cannot tell: pulumi-aws has no data source for reservations, and the
`aws.ec2.CapacityReservation` resource exposes neither the EC2 `State` nor `AvailableInstanceCount`.
The provider reads cancelled and expired reservations as missing, so those fail the read naming
the id (`resource 'cr-...' does not exist`); a reservation that is pending, or whose instances are
already in use, passes here. The reservation count checked is the total it reserves; see the rest
with `aws ec2 describe-capacity-reservations --capacity-reservation-ids cr-... --query
'CapacityReservations[0].[State,AvailableInstanceCount]'`. These checks run when the read
resolves, so `gpu_az` and `cluster_azs` are Outputs then, and they hold back (and fail) only the
resources that take them as inputs.

The GPU zone, without a reservation: `gpuAz` when set, else the first zone by name that offers
both node types. Zone names map to different physical zones in each account, so this choice is
stable for one account, not across accounts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.capacity import EKS_UNSUPPORTED_ZONE_IDS, VcpuQuota, on_demand_vcpu_quota, quota_increase_command
from infra.config import StackSettings
from infra.sizing import InstanceFacts, describe_instance_type


class PreflightError(pulumi.RunError):
    """The account or region cannot host the stack as configured; the message names the cause and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where the nodes go, decided and checked before any resource exists."""

    gpu_az: pulumi.Input[str]
    cluster_azs: pulumi.Input[list[str]]
    gpu_node: InstanceFacts
    system_node: InstanceFacts
    capacity_reservation_id: str | None


def plan_placement(settings: StackSettings) -> Placement:
    """Run every preflight check and choose the zones.

    Raises `PreflightError`, or `ConfigError` for a type that AWS offers but cannot describe.
    """
    zone_ids = _available_zones()
    gpu_zones = _offering_zones(settings.gpu_node_type, "gpuNodeType", settings.region, zone_ids)
    system_zones = _offering_zones(settings.system_node_type, "systemNodeType", settings.region, zone_ids)
    if len(system_zones) < 2:
        raise PreflightError(
            f"systemNodeType {settings.system_node_type} is offered in only one zone of {settings.region} that EKS can "
            f"use ({', '.join(system_zones)}), and the EKS control plane needs subnets in two zones: pick a "
            "systemNodeType offered in at least two zones (m7i.xlarge, m5.large, ...) or another region"
        )
    gpu_node = describe_instance_type(settings.gpu_node_type, "gpuNodeType", settings.region)
    system_node = describe_instance_type(settings.system_node_type, "systemNodeType", settings.region)
    _require_efa(gpu_node, settings.region)
    _check_vcpu_quotas(settings, gpu_node, system_node)
    zones = _Zones(settings, zone_ids, gpu_zones, system_zones)

    if settings.capacity_reservation_id:
        cluster_azs = _reservation_cluster_zones(settings, zones)
        gpu_az = cluster_azs.apply(lambda names: names[0])
    else:
        if settings.gpu_az:
            gpu_az = zones.check_gpu_zone(
                settings.gpu_az,
                f"config key 'gpuAz' = {settings.gpu_az!r}",
                "set gpuAz to one of them, or remove it to choose automatically",
            )
        else:
            gpu_az = zones.first_gpu_zone()
        cluster_azs = zones.cluster_zones(gpu_az)
    return Placement(
        gpu_az=gpu_az,
        cluster_azs=cluster_azs,
        gpu_node=gpu_node,
        system_node=system_node,
        capacity_reservation_id=settings.capacity_reservation_id,
    )


def _available_zones() -> dict[str, str]:
    """Zone name -> zone ID of the region's available availability zones (no Local or Wavelength Zones)."""
    try:
        result = aws.get_availability_zones(
            state="available", filters=[{"name": "zone-type", "values": ["availability-zone"]}]
        )
    except Exception as err:  # the first AWS call: a bad region or missing credentials surface here
        region = pulumi.Config("aws").get("region")
        raise PreflightError(
            f"config key 'aws:region' = {region!r}: AWS could not list its availability zones ({err}); "
            "check the region name (`aws ec2 describe-regions --query 'Regions[].RegionName'`) and your credentials"
        ) from None
    return dict(zip(result.names, result.zone_ids))


def _offering_zones(instance_type: str, key: str, region: str, zone_ids: dict[str, str]) -> list[str]:
    """Zones EKS can use that offer `instance_type`, sorted; fails when there is none."""
    offerings = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone",
        filters=[{"name": "instance-type", "values": [instance_type]}],
    )
    zones = sorted(
        zone for zone in set(offerings.locations)
        if zone in zone_ids and zone_ids[zone] not in EKS_UNSUPPORTED_ZONE_IDS
    )
    if not zones:
        raise PreflightError(
            f"{key} {instance_type} is not offered in any zone of {region} that EKS can use (unknown name, or not "
            "sold there): find a region that offers it with "
            f"`python -m infra.capacity --regions {' '.join(_candidate_regions(region))} --instance-type {instance_type}`, "
            "or check the name with "
            f"`aws ec2 describe-instance-type-offerings --region {region} --location-type availability-zone "
            f"--filters Name=instance-type,Values={instance_type}`"
        )
    return zones


def _candidate_regions(region: str) -> list[str]:
    """This region first, then the stack regions the project ships, without repeats."""
    return list(dict.fromkeys([region, "us-east-2", "us-west-2", "us-east-1"]))


def _require_efa(gpu_node: InstanceFacts, region: str) -> None:
    if not gpu_node.efa_supported or gpu_node.efa_interfaces < 1:
        raise PreflightError(
            f"gpuNodeType {gpu_node.instance_type} does not support EFA, so NCCL would fall back to TCP between the "
            "nodes: pick an EFA-capable GPU type such as g6.12xlarge, g6e.12xlarge, g5.12xlarge, p4d.24xlarge or "
            f"p5.48xlarge (list them with `aws ec2 describe-instance-types --region {region} --filters "
            "Name=network-info.efa-supported,Values=true --query 'InstanceTypes[?GpuInfo].InstanceType'`)"
        )


def _check_vcpu_quotas(settings: StackSettings, gpu_node: InstanceFacts, system_node: InstanceFacts) -> None:
    """Each On-Demand vCPU quota must cover every node group that draws on it."""
    groups: dict[VcpuQuota, list[tuple[int, InstanceFacts]]] = {}
    for count, node in ((settings.gpu_node_count, gpu_node), (settings.system_node_count, system_node)):
        quota = on_demand_vcpu_quota(node.instance_type)
        if quota is None:
            pulumi.log.warn(f"no On-Demand vCPU quota is known for {node.instance_type}; its quota was not checked")
            continue
        groups.setdefault(quota, []).append((count, node))
    for quota, nodes in groups.items():
        needed = sum(count * node.vcpus for count, node in nodes)
        value = _quota_value(quota, settings.region)
        if value < needed:
            wanted = " + ".join(f"{count} x {node.instance_type} ({node.vcpus} vCPU each)" for count, node in nodes)
            raise PreflightError(
                f"the vCPU quota '{quota.name}' ({quota.code}) in {settings.region} is {value:g}, and {wanted} "
                f"need {needed}: request an increase with `{quota_increase_command(quota, needed, settings.region)}`, "
                "or choose a region with room (`python -m infra.capacity`). This compares the quota itself; vCPUs of "
                "instances already running in the region count against it too, and "
                f"`python -m infra.capacity --regions {settings.region} --instance-type {settings.gpu_node_type}` "
                "shows them"
            )


def _quota_value(quota: VcpuQuota, region: str) -> float:
    try:
        return float(aws.servicequotas.get_service_quota(service_code="ec2", quota_code=quota.code).value)
    except Exception as err:  # the provider reports API failures (e.g. AccessDenied) as an invoke error
        raise PreflightError(
            f"could not read the vCPU quota '{quota.name}' ({quota.code}) in {region} ({err}): allow "
            "servicequotas:GetServiceQuota to the identity running Pulumi, or read it yourself with "
            f"`aws service-quotas get-service-quota --service-code ec2 --quota-code {quota.code} --region {region}`"
        ) from None


@dataclass(frozen=True)
class _Zones:
    """What the offerings say about the region's zones, and the zone rules built on them."""

    settings: StackSettings
    zone_ids: dict[str, str]
    gpu_zones: list[str]
    system_zones: list[str]

    @property
    def usable(self) -> list[str]:
        """Zones that can hold the GPU nodes: they offer both node types (and EKS can use them)."""
        return [zone for zone in self.gpu_zones if zone in self.system_zones]

    def check_gpu_zone(self, zone: str, source: str, fix: str) -> str:
        """`zone` when the GPU nodes can go there; else fail naming who chose it (`source`) and the `fix`."""
        problem = self._problem(zone)
        if problem:
            raise PreflightError(
                f"{source}: {zone} {problem}; the zones of {self.settings.region} that can hold the GPU nodes are "
                f"{', '.join(self.usable) or 'none'}: {fix}"
            )
        return zone

    def _problem(self, zone: str) -> str | None:
        if zone not in self.zone_ids:
            return "is not an available zone of the region"
        if self.zone_ids[zone] in EKS_UNSUPPORTED_ZONE_IDS:
            return (
                f"is zone {self.zone_ids[zone]}, where EKS cannot place control plane subnets "
                "(the GPU zone is one of the cluster's two zones)"
            )
        if zone not in self.gpu_zones:
            return f"does not offer gpuNodeType {self.settings.gpu_node_type}"
        if zone not in self.system_zones:
            return (
                f"does not offer systemNodeType {self.settings.system_node_type} "
                "(system nodes run in the GPU zone too)"
            )
        return None

    def first_gpu_zone(self) -> str:
        if not self.usable:
            raise PreflightError(
                f"no zone of {self.settings.region} offers both gpuNodeType {self.settings.gpu_node_type} "
                f"({', '.join(self.gpu_zones)}) and systemNodeType {self.settings.system_node_type} "
                f"({', '.join(self.system_zones)}): pick a systemNodeType offered in the GPU zones, or another region"
            )
        return self.usable[0]

    def cluster_zones(self, gpu_az: str) -> list[str]:
        """The GPU zone and the first other zone that offers the system type (there is one: checked up front)."""
        return [gpu_az, next(zone for zone in self.system_zones if zone != gpu_az)]


def _reservation_cluster_zones(settings: StackSettings, zones: _Zones) -> pulumi.Output[list[str]]:
    """Read the reservation, check it against the settings, and place the cluster around its zone."""
    reservation_id = settings.capacity_reservation_id
    reservation = aws.ec2.CapacityReservation.get("gpu-capacity-reservation", reservation_id)

    def check(found: dict) -> list[str]:
        if found["instance_type"] != settings.gpu_node_type:
            raise PreflightError(
                f"capacity reservation {reservation_id} reserves {found['instance_type']}, and gpuNodeType is "
                f"{settings.gpu_node_type}: set gpuNodeType to {found['instance_type']}, or use a reservation for "
                f"{settings.gpu_node_type}"
            )
        if found["instance_platform"] != "Linux/UNIX":
            raise PreflightError(
                f"capacity reservation {reservation_id} is for {found['instance_platform']} instances, and EKS nodes "
                "run Linux/UNIX: use a Linux/UNIX reservation"
            )
        if found["tenancy"] not in (None, "default"):
            raise PreflightError(
                f"capacity reservation {reservation_id} has {found['tenancy']} tenancy, and the GPU nodes launch with "
                "default tenancy: use a reservation with default tenancy"
            )
        if found["instance_count"] < settings.gpu_node_count:
            raise PreflightError(
                f"capacity reservation {reservation_id} holds {found['instance_count']} {settings.gpu_node_type} "
                f"instance(s), and gpuNodeCount is {settings.gpu_node_count}: set gpuNodeCount to "
                f"{found['instance_count']}, or grow the reservation "
                f"with `aws ec2 modify-capacity-reservation --capacity-reservation-id {reservation_id} "
                f"--instance-count {settings.gpu_node_count} --region {settings.region}`"
            )
        zone = found["availability_zone"]
        if settings.gpu_az and settings.gpu_az != zone:
            raise PreflightError(
                f"config key 'gpuAz' = {settings.gpu_az!r}, and capacity reservation {reservation_id} is in {zone}: "
                f"remove gpuAz (the reservation decides the GPU zone) or set it to {zone}"
            )
        gpu_az = zones.check_gpu_zone(
            zone, f"capacity reservation {reservation_id}", "use a capacity reservation in one of them"
        )
        return zones.cluster_zones(gpu_az)

    return pulumi.Output.all(
        instance_type=reservation.instance_type,
        instance_platform=reservation.instance_platform,
        tenancy=reservation.tenancy,
        instance_count=reservation.instance_count,
        availability_zone=reservation.availability_zone,
    ).apply(check)
