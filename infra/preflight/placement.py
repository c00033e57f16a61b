"""Where the nodes go: every preflight check run in order, and the zones they leave.

The GPU zone, without a reservation: `gpuAz` when set, else the zone the live cluster's GPU nodes
run in, else the first zone by name that offers both node types. Zone names map to different
physical zones in each account, so this choice is stable for one account, not across accounts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from infra.aws_rules.ami_types import GPU_AMI_TYPE, SYSTEM_AMI_TYPE
from infra.aws_rules.capacity_rules import (
    ReservationFacts,
)
from infra.aws_rules.live_stack import (
    LiveCluster,
)
from infra.aws_rules.sizing import InstanceFacts
from infra.config.stack import StackSettings
from infra.preflight.errors import PreflightError
from infra.preflight.kubernetes_version import check_kubernetes_version
from infra.preflight.live_cluster import checked_live_cluster, warn_about_a_degraded_gpu_group
from infra.preflight.node_types import require_architecture, require_efa
from infra.preflight.quotas import check_vcpu_quotas
from infra.preflight.reads.instance_types import describe_instance_type
from infra.preflight.reservation import read_reservation_facts, reservation_gpu_zone
from infra.preflight.subnet_room import check_gpu_subnet_room
from infra.preflight.zones import Zones, available_zones, offering_zones


@dataclass(frozen=True)
class Placement:
    """Where the nodes go, decided and checked before any resource exists.

    The zones are plain values, not Outputs: every check has run when `place_nodes` returns,
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


def place_nodes(settings: StackSettings, now: Callable[[], datetime] | None = None) -> Placement:
    """Run every preflight check and choose the zones; `now` is `utc_now` unless given.

    Raises `PreflightError`, or `ConfigError` for a type that AWS offers but cannot describe.
    """
    read_at = (now or utc_now)()
    zone_ids = available_zones()
    gpu_zones = offering_zones(settings.gpu_node_type, "gpuNodeType", settings.region, zone_ids)
    system_zones = offering_zones(settings.system_node_type, "systemNodeType", settings.region, zone_ids)
    if len(system_zones) < 2:
        raise PreflightError(
            f"config key 'systemNodeType' = {settings.system_node_type!r} is offered in only one zone of {settings.region} that EKS can "
            f"use ({', '.join(system_zones)}), and the EKS control plane needs subnets in two zones: pick a "
            "systemNodeType offered in at least two zones (m7i.xlarge, m5.large, ...) or another region"
        )
    live = checked_live_cluster(settings)
    gpu_node = describe_instance_type(settings.gpu_node_type, "gpuNodeType", settings.region)
    system_node = describe_instance_type(settings.system_node_type, "systemNodeType", settings.region)
    require_architecture(gpu_node, "gpuNodeType", GPU_AMI_TYPE)
    require_architecture(system_node, "systemNodeType", SYSTEM_AMI_TYPE)
    require_efa(gpu_node, settings.region)
    version_status = check_kubernetes_version(settings.kubernetes_version, settings.region)
    check_vcpu_quotas(settings, gpu_node, system_node)
    zones = Zones(settings, zone_ids, gpu_zones, system_zones)

    reservation = None
    if settings.capacity_reservation_id:
        reservation = read_reservation_facts(settings.capacity_reservation_id, settings)
        gpu_az = reservation_gpu_zone(settings, reservation, zones, read_at)
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
    check_gpu_subnet_room(settings, gpu_node, gpu_az)
    warn_about_a_degraded_gpu_group(settings, live)
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
