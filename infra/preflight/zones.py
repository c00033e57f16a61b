"""The region's zones: which EKS can use, which offer each node type, and the zone rules built on them."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws_rules.capacity_rules import (
    EKS_UNSUPPORTED_ZONE_IDS,
    usable_zones,
)
from infra.config.stack import StackSettings
from infra.preflight.errors import PreflightError


def available_zones() -> dict[str, str]:
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


def offering_zones(instance_type: str, key: str, region: str, zone_ids: dict[str, str]) -> list[str]:
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


@dataclass(frozen=True)
class Zones:
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
