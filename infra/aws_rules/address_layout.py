"""The VPC's address layout: each zone's private and public subnet blocks, fixed by the zone's letter
alone, so the network (`infra.resources.network`) and the preview's check of the GPU subnet's room
(`infra.preflight.subnet_room`) compute the same blocks.

A subnet's block never depends on which zone holds the GPU nodes: Pulumi replaces a subnet whose
block changes by creating the new one first, and EC2 refuses a block that overlaps a subnet still in
the VPC (`InvalidSubnet.Conflict`).

Private subnets of zones a-c take the first three quarters of the VPC, zones d-g an eighth of the
last quarter each (its upper half); public subnets take a 64th of the VPC each, in zone-letter
order, from the start of the last quarter. Zones a-c keep the blocks of the positional layout this
replaces, so stacks first deployed in zones a and b keep their subnets.
"""

from __future__ import annotations

import ipaddress

_ZONE_LETTERS = "abcdefg"


def zone_cidrs(vpc_cidr: str, zone: str) -> tuple[str, str]:
    """(private, public) CIDR blocks of `zone` in the VPC, fixed by the zone's letter."""
    letter = zone[-1]
    if letter not in _ZONE_LETTERS:
        raise ValueError(f"zone {zone}: the address layout holds zones a to g")
    index = _ZONE_LETTERS.index(letter)
    quarters = list(ipaddress.IPv4Network(vpc_cidr).subnets(prefixlen_diff=2))
    last = quarters[3]
    private = quarters[index] if index < 3 else list(last.subnets(prefixlen_diff=3))[index + 1]
    public = list(last.subnets(prefixlen_diff=4))[index]
    return str(private), str(public)
