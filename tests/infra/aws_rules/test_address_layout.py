"""The VPC's address layout: each zone's blocks follow its letter, lie in the VPC and never overlap.
(The blocks the network keeps for stacks of the earlier plan: tests/infra/resources/test_network.py.)"""

from __future__ import annotations

import ipaddress

import pytest

from infra.aws_rules.address_layout import zone_cidrs


@pytest.mark.parametrize("vpc", ["10.0.0.0/16", "10.20.0.0/20"])
def test_subnet_blocks_follow_the_zone_letter_and_never_overlap(vpc):
    blocks = [ipaddress.ip_network(b) for zone in "abcdefg" for b in zone_cidrs(vpc, f"x-1{zone}")]
    assert all(block.subnet_of(ipaddress.ip_network(vpc)) for block in blocks)
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    assert all(block.num_addresses >= 64 for block in blocks)


def test_a_zone_outside_the_plan_is_refused():
    with pytest.raises(ValueError, match="the address layout holds zones a to g"):
        zone_cidrs("10.0.0.0/16", "us-east-1h")
