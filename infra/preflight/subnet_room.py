"""Whether the GPU subnet has the addresses the VPC CNI holds for the GPU nodes."""

from __future__ import annotations

import ipaddress

from infra.aws_rules.address_layout import zone_cidrs
from infra.aws_rules.sizing import InstanceFacts
from infra.config.stack import ConfigError, StackSettings

# AWS reserves five addresses of every subnet (VPC user guide, "Subnet CIDR blocks").
SUBNET_RESERVED_ADDRESSES = 5
# ENIs whose addresses the VPC CNI holds on a node: the one its pods use and, by default
# (WARM_ENI_TARGET=1), a warm one beside it, each with every secondary address it can take.
ENIS_HELD_PER_NODE = 2


def gpu_subnet_shortfall(block: str, nodes: int, ipv4_per_interface: int) -> int:
    """Addresses the GPU nodes can hold beyond what their subnet has; 0 when they fit."""
    usable = ipaddress.ip_network(block).num_addresses - SUBNET_RESERVED_ADDRESSES
    return max(0, nodes * ENIS_HELD_PER_NODE * ipv4_per_interface - usable)


def check_gpu_subnet_room(settings: StackSettings, gpu_node: InstanceFacts, gpu_az: str) -> None:
    block = zone_cidrs(settings.vpc_cidr, gpu_az)[0]
    if gpu_subnet_shortfall(block, settings.gpu_node_count, gpu_node.ipv4_per_interface):
        held = settings.gpu_node_count * ENIS_HELD_PER_NODE * gpu_node.ipv4_per_interface
        raise ConfigError(
            f"config key 'vpcCidr' = {settings.vpc_cidr!r}: the GPU subnet in {gpu_az} is {block}, and "
            f"{settings.gpu_node_count} {gpu_node.instance_type} nodes can hold {held} of its addresses (the VPC CNI "
            f"keeps {ENIS_HELD_PER_NODE} interfaces of {gpu_node.ipv4_per_interface} per node): use a larger vpcCidr "
            "(a /16 gives every zone room), or a GPU zone whose letter is a to c (gpuAz), which get a quarter of the VPC"
        )
