"""The VPC's addressing: each zone's blocks follow its letter and never overlap."""

from __future__ import annotations

import ipaddress

import pytest

from infra.resources.network import zone_cidrs


@pytest.mark.parametrize("vpc", ["10.0.0.0/16", "10.20.0.0/20"])
def test_subnet_blocks_follow_the_zone_letter_and_never_overlap(vpc):
    blocks = [ipaddress.ip_network(b) for zone in "abcdefg" for b in zone_cidrs(vpc, f"x-1{zone}")]
    assert all(block.subnet_of(ipaddress.ip_network(vpc)) for block in blocks)
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    assert all(block.num_addresses >= 64 for block in blocks)
