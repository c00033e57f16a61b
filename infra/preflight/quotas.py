"""The On-Demand vCPU quotas against the node groups that draw on them.

The invoke returns the quota, not what already runs against it, so instances running in the region
can still take the room: `python -m infra.region_survey` shows usage."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.aws_rules.capacity_rules import (
    VcpuQuota,
    on_demand_vcpu_quota,
    quota_increase_command,
    vcpu_shortfall,
)
from infra.aws_rules.sizing import InstanceFacts
from infra.config.stack import StackSettings
from infra.preflight.errors import PreflightError


def check_vcpu_quotas(settings: StackSettings, gpu_node: InstanceFacts, system_node: InstanceFacts) -> None:
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
