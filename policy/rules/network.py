"""The network: no public IP on a node, an API endpoint not open to the internet, each VPC's default security group closed."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    AWS_EKS_CLUSTER,
    DEFAULT_SECURITY_GROUP,
    LAUNCH_TEMPLATE,
    PULUMI_EKS_CLUSTER,
    SUBNET,
    VPC,
    StackResource,
    dig,
    is_false,
    is_true,
    is_unknown,
    items,
    linked,
)
from .registry import MANDATORY, resource_rule, stack_rule


@resource_rule(
    "nodes-without-public-ips",
    MANDATORY,
    description="Nodes get no public IP: not from a launch template, a subnet, or pulumi-eks settings.",
    resources="launch templates, subnets, pulumi-eks clusters and node groups",
    requires="no `associatePublicIpAddress`, `mapPublicIpOnLaunch` or `nodeAssociatePublicIpAddress` set to true",
)
def nodes_without_public_ips(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """No launch template, subnet or pulumi-eks node setting may hand a node a public IP address."""
    violations = []
    if resource_type == LAUNCH_TEMPLATE:
        for index, interface in enumerate(items(props.get("networkInterfaces"))):
            if is_true(dig(interface, "associatePublicIpAddress")):
                violations.append(
                    f"networkInterfaces[{index}].associatePublicIpAddress is true: nodes must have no public IP; "
                    "set it to false (they reach the internet through the NAT gateway)"
                )
    elif resource_type == SUBNET:
        if is_true(props.get("mapPublicIpOnLaunch")):
            violations.append(
                "mapPublicIpOnLaunch is true: every instance launched in this subnet gets a public IP; set it to false"
            )
    elif resource_type.startswith("eks:index:") and is_true(props.get("nodeAssociatePublicIpAddress")):
        violations.append("nodeAssociatePublicIpAddress is true: set it to false so nodes get no public IP")
    return violations


def _internet_wide(cidrs: Any) -> list[str]:
    """ "0.0.0.0/0" and/or "::/0" when the known blocks of the list, together, admit every address."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for block in items(cidrs):
        if is_unknown(block):
            continue
        try:
            network = ipaddress.ip_network(str(block), strict=False)
        except ValueError:
            continue
        if isinstance(network, ipaddress.IPv4Network):
            v4.append(network)
        else:
            v6.append(network)
    everything = []
    if any(merged.prefixlen == 0 for merged in ipaddress.collapse_addresses(v4)):
        everything.append("0.0.0.0/0")
    if any(merged.prefixlen == 0 for merged in ipaddress.collapse_addresses(v6)):
        everything.append("::/0")
    return everything


@resource_rule(
    "eks-api-not-open-to-internet",
    MANDATORY,
    description="A public EKS API endpoint admits listed CIDRs only, never 0.0.0.0/0.",
    resources="EKS clusters",
    requires="a public API endpoint has a CIDR allow-list, and the list does not add up to `0.0.0.0/0` or `::/0` (an empty list means `0.0.0.0/0` to EKS)",
)
def eks_api_not_open(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A public API endpoint admits only listed addresses; EKS's default list is 0.0.0.0/0."""
    if resource_type == PULUMI_EKS_CLUSTER:
        public, cidrs, where = props.get("endpointPublicAccess"), props.get("publicAccessCidrs"), ""
    elif resource_type == AWS_EKS_CLUSTER:
        vpc_config = props.get("vpcConfig")
        if is_unknown(vpc_config):
            return []
        public = dig(vpc_config, "endpointPublicAccess")
        cidrs = dig(vpc_config, "publicAccessCidrs")
        where = "vpcConfig."
    else:
        return []
    if is_false(public) or is_unknown(public) or is_unknown(cidrs):
        return []
    if not items(cidrs):
        return [
            f"{where}endpointPublicAccess is on and {where}publicAccessCidrs is empty, which EKS reads as 0.0.0.0/0: "
            "list your own addresses (config endpointPublicAccessCidrs) or turn the public endpoint off"
        ]
    return [
        f"{where}publicAccessCidrs cover {everything}: the Kubernetes API would be open to the whole internet; "
        "list only your own addresses"
        for everything in _internet_wide(cidrs)
    ]


@stack_rule(
    "vpc-default-security-group-closed",
    MANDATORY,
    description="Every VPC's default security group is managed by the stack and has no rules.",
    resources="VPCs and default security groups",
    requires="every VPC's default security group is managed by the stack, with no ingress or egress rules",
)
def default_security_group_closed(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Each VPC's default security group is taken over and emptied of rules (AWS's default admits all
    traffic among its members and out)."""
    groups = [r for r in resources if r.type == DEFAULT_SECURITY_GROUP]
    violations = []
    for vpc in (r for r in resources if r.type == VPC):
        managed = linked(vpc, "id", groups, "vpcId")
        if not managed:
            violations.append(
                (
                    vpc.urn,
                    "the VPC's default security group keeps AWS's rules: manage it with a "
                    "DefaultSecurityGroup without ingress or egress",
                )
            )
        for group in managed:
            rules = [key for key in ("ingress", "egress") if items(group.props.get(key))]
            if rules:
                violations.append(
                    (group.urn, f"the default security group has {' and '.join(rules)} rules: remove them")
                )
    return violations
