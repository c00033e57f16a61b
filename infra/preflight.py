"""Preflight: can this account and region host the stack, and in which zones? Answered in `pulumi preview`.

Every check is a synchronous invoke of the AWS provider, so it runs in `pulumi preview` with the
user's own provider settings, before any resource is registered, and fails with a message that
names the cause and the fix:

- the GPU type is offered in a zone of the region EKS can use, and the system type in two of
  them (the EKS control plane needs subnets in two zones; the system nodes run in both);
- the GPU type supports EFA (its EFA interface and network card counts travel in `Placement.gpu_node`);
- the On-Demand vCPU quota of each instance class covers the node groups (`gpuNodeCount x vCPU`,
  96 for 2 x g6.12xlarge). The invoke returns the quota, not what already runs against it, so
  instances running in the region can still take the room: `python -m infra.region_survey` shows usage;
- a capacity reservation (`capacityReservationId`) exists, is `active` (or is a Capacity Block
  `scheduled` to start within `training.timeoutMinutes`, which the training run waits for),
  reserves the GPU type for Linux/UNIX with default tenancy, can hold `gpuNodeCount` instances, and
  decides the GPU zone.
  It can hold its available instances plus the ones this cluster already runs in it: EC2 counts
  this stack's own GPU nodes as used, so without adding them back every `pulumi up` after the
  first would be refused. They are found with `ec2:DescribeInstances`, filtered on the
  reservation, the `eks:cluster-name` tag that EKS puts on the instances of a managed node
  group, and the states pending and running; another cluster's instances stay counted as used.

pulumi-aws has no data source for capacity reservations, and its `aws.ec2.CapacityReservation`
resource lacks the state and the available count, so the reservation is read through Cloud Control
(`aws.cloudcontrol.get_resource`), which returns the CloudFormation properties of
`AWS::EC2::CapacityReservation`. Older versions of that schema carry no `State`: then the state
cannot be read here, and the check relies on `AvailableInstanceCount` alone. The same read gives
`PlacementGroupArn` (the cluster placement group the reservation was created in, which the GPU
launch template then targets) and `ReservationType` (`capacity-block` for a Capacity Block for
ML, which the node group must launch as such); without them the reservation is taken as a plain
On-Demand Capacity Reservation outside any placement group.

The GPU node group of a live cluster is read too: a DEGRADED group is warned about with its fix
(`infra.aws_facts.live_stack.gpu_group_warning`).

Judgements live in `infra.aws_facts.capacity_rules`; this module fetches facts and words the refusals.

The run's window (`deadline_of`, `fit_the_window`): the reservation's usable end or
`training.deadline`, the earlier, is the job's `--deadline`, and the predicted run is judged
against it; the arithmetic is `infra.aws_facts.reservation_window`'s.

The GPU zone, without a reservation: `gpuAz` when set, else the first zone by name that offers
both node types. Zone names map to different physical zones in each account, so this choice is
stable for one account, not across accounts.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pulumi
import pulumi_aws as aws

from infra.aws_facts.capacity_rules import (
    EKS_UNSUPPORTED_ZONE_IDS,
    ReservationFacts,
    ReservationMisfit,
    VcpuQuota,
    has_efa,
    on_demand_vcpu_quota,
    quota_increase_command,
    reservation_misfit,
    usable_zones,
    vcpu_shortfall,
)
from infra.aws_facts.live_stack import (
    LiveCluster,
    gpu_group_warning,
    orphaned_log_group,
    read_live_cluster,
    version_change_problem,
    vpc_change_problem,
)
from infra.aws_facts.reservation_window import (
    RESERVATION_KEY,
    JobTimes,
    RunDeadline,
    StartUp,
    Verdict,
    WindowFit,
    fit_window,
    parse_aws_time,
    run_deadline,
    seconds_until,
    start_up,
    usable_end,
    utc_text,
)
from infra.aws_facts.sizing import InstanceFacts, describe_instance_type
from infra.config.stack import ConfigError, StackSettings
from infra.config.training_settings import configured_deadline
from infra.plan.planner import StrategyPlan, workload_of
from infra.resources.cluster import control_plane_log_group
from infra.resources.network import zone_cidrs
from infra.resources.node_groups import AMI_ARCHITECTURE, GPU_AMI_TYPE, SYSTEM_AMI_TYPE
from training.config.deadline_margin import estimated_checkpoint_s, estimated_export_s
from training.config.run_config import TrainConfig


class PreflightError(pulumi.RunError):
    """The account or region cannot host the stack as configured; the message names the cause and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where the nodes go, decided and checked before any resource exists.

    The zones are plain values, not Outputs: every check has run when `plan_placement` returns,
    so a failure stops the whole program rather than only the resources that take the zones.
    """

    gpu_az: str
    cluster_azs: list[str]
    # Zones that get subnets whatever the GPU zone: the first three (by name) offering the system type.
    home_azs: list[str]
    gpu_node: InstanceFacts
    system_node: InstanceFacts
    # When the preview read these facts: every judgement of time is made against it.
    read_at: datetime
    reservation: ReservationFacts | None = None
    # The cluster this stack already runs, as the preview read it; None before the first deploy.
    live: LiveCluster | None = None
    # eks:DescribeClusterVersions' `versionStatus` of kubernetesVersion (STANDARD_SUPPORT,
    # EXTENDED_SUPPORT), which sets the control plane's hourly price; None where it was not read.
    kubernetes_version_status: str | None = None

    @property
    def capacity_reservation_id(self) -> str | None:
        return self.reservation.reservation_id if self.reservation else None

    @property
    def gpus_from(self) -> datetime | None:
        """The start of a Capacity Block not begun yet, which the training run waits for; else None."""
        return self.reservation.start_date if self.reservation and self.reservation.awaits_start else None


def utc_now() -> datetime:
    """The machine's time in UTC, read once per preview (tests run the program with their own)."""
    return datetime.now(UTC)


def plan_placement(settings: StackSettings, now: Callable[[], datetime] | None = None) -> Placement:
    """Run every preflight check and choose the zones; `now` is `utc_now` unless given.

    Raises `PreflightError`, or `ConfigError` for a type that AWS offers but cannot describe.
    """
    read_at = (now or utc_now)()
    zone_ids = _available_zones()
    gpu_zones = _offering_zones(settings.gpu_node_type, "gpuNodeType", settings.region, zone_ids)
    system_zones = _offering_zones(settings.system_node_type, "systemNodeType", settings.region, zone_ids)
    if len(system_zones) < 2:
        raise PreflightError(
            f"config key 'systemNodeType' = {settings.system_node_type!r} is offered in only one zone of {settings.region} that EKS can "
            f"use ({', '.join(system_zones)}), and the EKS control plane needs subnets in two zones: pick a "
            "systemNodeType offered in at least two zones (m7i.xlarge, m5.large, ...) or another region"
        )
    live = _live_cluster(settings)
    gpu_node = describe_instance_type(settings.gpu_node_type, "gpuNodeType", settings.region)
    system_node = describe_instance_type(settings.system_node_type, "systemNodeType", settings.region)
    _require_architecture(gpu_node, "gpuNodeType", GPU_AMI_TYPE)
    _require_architecture(system_node, "systemNodeType", SYSTEM_AMI_TYPE)
    _require_efa(gpu_node, settings.region)
    version_status = _check_kubernetes_version(settings.kubernetes_version, settings.region)
    _check_vcpu_quotas(settings, gpu_node, system_node)
    zones = _Zones(settings, zone_ids, gpu_zones, system_zones)

    reservation = None
    if settings.capacity_reservation_id:
        reservation = _reservation(settings.capacity_reservation_id, settings)
        gpu_az = _reservation_gpu_zone(settings, reservation, zones, read_at)
    elif settings.gpu_az:
        gpu_az = zones.check_gpu_zone(
            settings.gpu_az,
            f"config key 'gpuAz' = {settings.gpu_az!r}",
            "set gpuAz to one of them, or remove it to choose automatically",
        )
    elif live and live.gpu_zone:
        # Kept: a zone that AWS starts offering the types in would otherwise move the GPU nodes.
        gpu_az = zones.check_gpu_zone(
            live.gpu_zone,
            f"the GPU nodes of cluster {settings.cluster_name} run in {live.gpu_zone}, which",
            "set gpuAz to move them (the GPU node group is replaced)",
        )
    else:
        gpu_az = zones.first_gpu_zone()
    _check_gpu_subnet_room(settings, gpu_node, gpu_az)
    _warn_about_a_degraded_gpu_group(settings, live)
    return Placement(
        gpu_az=gpu_az,
        cluster_azs=zones.cluster_zones(gpu_az),
        # A live cluster keeps the zones of its subnets: EKS refuses subnets in other zones.
        home_azs=list(live.zones) if live else zones.system_zones[:3],
        gpu_node=gpu_node,
        system_node=system_node,
        kubernetes_version_status=version_status,
        reservation=reservation,
        live=live,
        read_at=read_at,
    )


def _live_cluster(settings: StackSettings) -> LiveCluster | None:
    """The cluster this stack already runs, checked against the settings that it cannot change."""
    live = read_live_cluster(settings.cluster_name)
    if live is None:
        log_group = control_plane_log_group(settings.cluster_name)
        if orphaned_log_group(log_group):
            raise PreflightError(
                f"config key 'clusterName' = {settings.cluster_name!r}: no cluster of that name runs, and its log "
                f"group {log_group} is left from one that was destroyed (EKS writes its last logs after the group "
                f"is deleted): delete it with `aws logs delete-log-group --log-group-name {log_group} --region "
                f"{settings.region}`, then run `pulumi up` again"
            )
        return None
    problem = vpc_change_problem(live, settings.vpc_cidr)
    if problem:
        raise ConfigError(f"config key 'vpcCidr' = {settings.vpc_cidr!r}: {problem}")
    problem = version_change_problem(live.version, settings.kubernetes_version)
    if problem:
        raise ConfigError(f"config key 'kubernetesVersion' = {settings.kubernetes_version!r}: {problem}")
    return live


def _warn_about_a_degraded_gpu_group(settings: StackSettings, live: LiveCluster | None) -> None:
    if live is not None and live.gpu_group is not None:
        warning = gpu_group_warning(
            settings.cluster_name, settings.region, live.gpu_group, settings.gpu_node_count
        )
        if warning:
            pulumi.log.warn(warning)


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
    return dict(zip(result.names, result.zone_ids, strict=True))


def _offering_zones(instance_type: str, key: str, region: str, zone_ids: dict[str, str]) -> list[str]:
    """Zones EKS can use that offer `instance_type`, sorted; fails when there is none."""
    offerings = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone",
        filters=[{"name": "instance-type", "values": [instance_type]}],
    )
    zones = usable_zones(offerings.locations, zone_ids)
    if not zones:
        raise PreflightError(
            f"config key '{key}' = {instance_type!r} is not offered in any zone of {region} that EKS can use (unknown name, or not "
            "sold there): find a region that offers it with "
            f"`python -m infra.region_survey --regions {' '.join(_candidate_regions(region))} --instance-type {instance_type}`, "
            "or check the name with "
            f"`aws ec2 describe-instance-type-offerings --region {region} --location-type availability-zone "
            f"--filters Name=instance-type,Values={instance_type}`"
        )
    return zones


def _candidate_regions(region: str) -> list[str]:
    """This region first, then the stack regions the project ships, without repeats."""
    return list(dict.fromkeys([region, "us-east-2", "us-west-2", "us-east-1"]))


def _require_architecture(node: InstanceFacts, key: str, ami_type: str) -> None:
    architecture = AMI_ARCHITECTURE[ami_type]
    if architecture not in node.architectures:
        raise ConfigError(
            f"config key '{key}' = {node.instance_type!r}: its CPU architecture is {', '.join(node.architectures)}, "
            f"and the node group boots the EKS AMI {ami_type}, built for {architecture}: pick an {architecture} "
            "instance type (g6.12xlarge for GPUs, m7i.xlarge for the system nodes)"
        )


def kubernetes_version_problem(version: str, offered: dict[str, str]) -> str | None:
    """Why EKS will not create a cluster of `version`, from DescribeClusterVersions' answer
    (version -> `versionStatus`: STANDARD_SUPPORT, EXTENDED_SUPPORT or UNSUPPORTED)."""
    usable = sorted((v for v, status in offered.items() if status != "UNSUPPORTED"), key=_version_key)
    if offered.get(version, "UNSUPPORTED") == "UNSUPPORTED":
        return f"EKS offers {', '.join(usable)} here: pick one of them"
    return None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _check_kubernetes_version(version: str, region: str) -> str | None:
    """EKS creates clusters only of the versions DescribeClusterVersions lists; one in extended
    support costs more per cluster-hour (EKS pricing), which the preview says. Returns the
    version's status, None where it could not be read."""
    try:
        answer = aws.eks.get_cluster_versions()
    except Exception as err:  # e.g. no eks:DescribeClusterVersions permission: EKS judges at create
        pulumi.log.warn(
            f"kubernetesVersion {version} was not checked against EKS's versions in {region} ({err})"
        )
        return None
    offered = {item.cluster_version: item.version_status for item in answer.cluster_versions}
    problem = kubernetes_version_problem(version, offered)
    if problem:
        raise ConfigError(f"config key 'kubernetesVersion' = {version!r}: {problem}")
    if offered[version] == "EXTENDED_SUPPORT":
        pulumi.log.warn(
            f"kubernetesVersion {version} is in EKS extended support in {region}, billed at a higher rate per "
            "cluster-hour than standard support: plan an upgrade"
        )
    return offered[version]


# AWS reserves five addresses of every subnet (VPC user guide, "Subnet CIDR blocks").
SUBNET_RESERVED_ADDRESSES = 5
# ENIs whose addresses the VPC CNI holds on a node: the one its pods use and, by default
# (WARM_ENI_TARGET=1), a warm one beside it, each with every secondary address it can take.
ENIS_HELD_PER_NODE = 2


def gpu_subnet_shortfall(block: str, nodes: int, ipv4_per_interface: int) -> int:
    """Addresses the GPU nodes can hold beyond what their subnet has; 0 when they fit."""
    usable = ipaddress.ip_network(block).num_addresses - SUBNET_RESERVED_ADDRESSES
    return max(0, nodes * ENIS_HELD_PER_NODE * ipv4_per_interface - usable)


def _check_gpu_subnet_room(settings: StackSettings, gpu_node: InstanceFacts, gpu_az: str) -> None:
    block = zone_cidrs(settings.vpc_cidr, gpu_az)[0]
    if gpu_subnet_shortfall(block, settings.gpu_node_count, gpu_node.ipv4_per_interface):
        held = settings.gpu_node_count * ENIS_HELD_PER_NODE * gpu_node.ipv4_per_interface
        raise ConfigError(
            f"config key 'vpcCidr' = {settings.vpc_cidr!r}: the GPU subnet in {gpu_az} is {block}, and "
            f"{settings.gpu_node_count} {gpu_node.instance_type} nodes can hold {held} of its addresses (the VPC CNI "
            f"keeps {ENIS_HELD_PER_NODE} interfaces of {gpu_node.ipv4_per_interface} per node): use a larger vpcCidr "
            "(a /16 gives every zone room), or a GPU zone whose letter is a to c (gpuAz), which get a quarter of the VPC"
        )


def _require_efa(gpu_node: InstanceFacts, region: str) -> None:
    if not has_efa(gpu_node.efa_supported, gpu_node.efa_interfaces):
        raise PreflightError(
            f"config key 'gpuNodeType' = {gpu_node.instance_type!r} does not support EFA, so NCCL would fall back to TCP between the "
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
            pulumi.log.warn(
                f"no On-Demand vCPU quota is known for {node.instance_type}; its quota was not checked"
            )
            continue
        groups.setdefault(quota, []).append((count, node))
    for quota, nodes in groups.items():
        needed = sum(count * node.vcpus for count, node in nodes)
        value = _quota_value(quota, settings.region)
        if vcpu_shortfall(value, 0, needed):
            wanted = " + ".join(
                f"{count} x {node.instance_type} ({node.vcpus} vCPU each)" for count, node in nodes
            )
            raise PreflightError(
                f"the vCPU quota '{quota.name}' ({quota.code}) in {settings.region} is {value:g}, and {wanted} "
                f"need {needed}: request an increase with `{quota_increase_command(quota, needed, settings.region)}`, "
                "or choose a region with room (`python -m infra.region_survey`). This compares the quota itself; vCPUs of "
                "instances already running in the region count against it too, and "
                f"`python -m infra.region_survey --regions {settings.region} --instance-type {settings.gpu_node_type}` "
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


def _reservation(reservation_id: str, settings: StackSettings) -> ReservationFacts:
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


def _reservation_gpu_zone(
    settings: StackSettings, reservation: ReservationFacts, zones: _Zones, now: datetime
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
            f"{utc_text(start)}, in {_span(wait_s)}, and `pulumi up` waits for it at most training.timeoutMinutes "
            f"({timeout} min): run `pulumi up` after {utc_text(start - timedelta(minutes=timeout))}, or set "
            f"training.timeoutMinutes to {math.ceil(wait_s / 60)} or more"
        )
    waits = "the training run waits for it, then for the nodes" if settings.train else "no training run waits"
    pulumi.log.info(
        f"capacity reservation {reservation.reservation_id} is a Capacity Block that starts at {utc_text(start)}, "
        f"in {_span(wait_s)}: its GPU nodes launch then ({waits})"
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


# --- the run's window: the deadline it gets, and whether the predicted run fits before it ----------


def deadline_of(settings: StackSettings, placement: Placement) -> RunDeadline | None:
    """The run's deadline: the reservation's usable end or `training.deadline`, the earlier."""
    reservation = placement.reservation
    end = usable_end(reservation.reservation_type, reservation.end_date) if reservation else None
    return run_deadline(end, configured_deadline(settings.training))


def _span(seconds: float) -> str:
    """`2 h 05 min`, `14 min`, `40 s`."""
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def _deadline_source(deadline: RunDeadline, reservation: ReservationFacts | None) -> str:
    """Where the deadline comes from, in words."""
    if deadline.key != RESERVATION_KEY or reservation is None or reservation.end_date is None:
        return f"training.deadline {deadline.text}"
    end = utc_text(reservation.end_date)
    if reservation.is_capacity_block:
        return (
            f"Capacity Block {reservation.reservation_id} ends at {end}; EKS scales its node group to 0 at "
            f"{deadline.text}, 40 min before (EC2 terminates its instances from 30 min before)"
        )
    return (
        f"capacity reservation {reservation.reservation_id} ends at {end}; EC2 cancels it within the hour after "
        "and its instances then bill at the On-Demand price"
    )


def _start_up_words(start: StartUp, now: datetime) -> str:
    """`control plane 15 min, the block's start at ..., then GPU nodes 5 min + image pull 10 min + fabric gate 1 min`."""
    nodes = [
        ("GPU nodes", start.gpu_nodes_s),
        ("image pull", start.image_pull_s),
        ("fabric gate", start.gate_s),
    ]
    after = " + ".join(f"{name} {_span(seconds)}" for name, seconds in nodes if seconds)
    before = [f"control plane {_span(start.control_plane_s)}"] if start.control_plane_s else []
    if start.gpus_from is not None and start.gpus_from > now + timedelta(seconds=start.control_plane_s):
        before.append(f"the block's start at {utc_text(start.gpus_from)}")
    return ", then ".join([", ".join(before), after]) if before else after


def _job_times(config: TrainConfig, predicted: StrategyPlan | None) -> JobTimes:
    """The job's steps at the planner's step time, its checkpoints and export at the training side's estimates."""
    workload = workload_of(config)
    parameters = workload.params if workload else 0
    return JobTimes(
        steps=config.steps,
        step_s=predicted.step_time_s if predicted else None,
        checkpoint_s=estimated_checkpoint_s(parameters),
        checkpoint_every=config.checkpoint_every,
        final_checkpoint=bool(config.checkpoint_every) or config.export_hf,
        evaluates=config.eval_data is not None,
        eval_every=config.eval_every,
        export_s=estimated_export_s(parameters, config.export_dtype) if config.export_hf else 0.0,
    )


def fit_the_window(
    settings: StackSettings,
    placement: Placement,
    deadline: RunDeadline | None,
    config: TrainConfig,
    predicted: StrategyPlan | None,
) -> WindowFit | None:
    """At preview: the predicted run against its deadline. Fits: an info line with the time to
    spare; only some steps fit: a warning (the job stops at its deadline with a checkpoint); not
    even one checkpointed step fits: refused, naming the key the deadline comes from."""
    if deadline is None:
        return None
    reservation, now = placement.reservation, placement.read_at
    nodes_running = bool(reservation and reservation.own_instances >= settings.gpu_node_count)
    start = start_up(placement.live is not None, nodes_running, placement.gpus_from)
    job = _job_times(config, predicted)
    fit = fit_window(job, start, deadline.at, now)
    source = _deadline_source(deadline, reservation)
    begins = f"start-up {_start_up_words(start, now)}: the job starts about {utc_text(fit.job_starts)}"
    steps = f"{job.steps} steps x {job.step_s:.2f} s" if job.step_s is not None else f"{job.steps} steps"
    checkpoints = (
        f"{fit.checkpoints} checkpoint(s) of an estimated {_span(job.checkpoint_s)}"
        if fit.checkpoints
        else "no checkpoint"
    )
    if fit.verdict is Verdict.REFUSED:
        _refuse_the_window(settings, deadline, reservation, source, begins, fit, job)
    if fit.verdict is Verdict.UNPREDICTED:
        pulumi.log.info(
            f"run window: {source}. The job gets --deadline {deadline.text} and stops before it with a "
            f"checkpoint; with no step time from the planner for {settings.gpu_node_type}, its {steps} are not "
            f"predicted ({begins})"
        )
    elif fit.verdict is Verdict.PARTIAL:
        pulumi.log.warn(
            f"run window: {source}. Predicted: {begins}; only {fit.steps} of the {job.steps} configured steps "
            f"fit before --deadline {deadline.text} ({steps}; {checkpoints}): the job stops at its deadline with a "
            f"checkpoint of step {fit.steps}; lower training.steps to {fit.steps}, or give the run a later window"
        )
    elif fit.verdict is Verdict.FITS:
        assert fit.spare_s is not None and fit.run_s is not None
        pulumi.log.info(
            f"run window: {source}. Predicted: {begins}; {steps} with {checkpoints} take {_span(fit.run_s)}: "
            f"the run fits before --deadline {deadline.text} with {_span(fit.spare_s)} to spare"
        )
    return fit


def _refuse_the_window(
    settings: StackSettings,
    deadline: RunDeadline,
    reservation: ReservationFacts | None,
    source: str,
    begins: str,
    fit: WindowFit,
    job: JobTimes,
) -> None:
    one = f"{_span(fit.run_s)} for one step with its checkpoint" if fit.run_s is not None else "a checkpoint"
    left = f"{_span(fit.available_s)} before the deadline" if fit.available_s > 0 else "after the deadline"
    window = f"{source}. Predicted: {begins}, {left}, and it needs {one}"
    if deadline.key != RESERVATION_KEY or reservation is None:
        raise ConfigError(
            f"config key 'training.deadline' = {deadline.text!r}: {window}: not even one checkpointed step fits; "
            "set a later training.deadline, or remove it"
        )
    reservation_id = reservation.reservation_id
    if reservation.is_capacity_block:
        fix = (
            "extend the block (`aws ec2 describe-capacity-block-extension-offerings --capacity-reservation-id "
            f"{reservation_id} --capacity-block-extension-duration-hours 24 --region {settings.region}` lists the "
            "offers), set capacityReservationId to a later block, or remove it to run On-Demand"
        )
    else:
        fix = (
            f"move its end date (`aws ec2 modify-capacity-reservation --capacity-reservation-id {reservation_id} "
            f"--end-date-type limited --end-date <later> --region {settings.region}`), or remove capacityReservationId"
        )
    raise PreflightError(
        f"config key 'capacityReservationId' = {reservation_id!r}: {window}: not even one checkpointed step fits; {fix}"
    )
