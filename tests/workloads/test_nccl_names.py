"""The names in NCCL's lines: a net plugin's family and a libfabric provider's transport."""

from __future__ import annotations

import pytest

from workloads.nccl_names import FAMILY_NAMES, PROVIDER_NAMES, network_family, provider_transport


@pytest.mark.parametrize(
    "plugin, family",
    [
        ("Socket", "socket"),
        (" socket ", "socket"),
        ("IB", "ib"),
        ("IBext_v8", "ib"),
        ("Libfabric", "libfabric"),
        ("AWS Libfabric", "libfabric"),
        ("OFI", "libfabric"),
        ("Custom", "Custom"),
    ],
)
def test_a_plugin_name_maps_to_its_family_or_stays_itself(plugin, family):
    assert network_family(plugin) == family


@pytest.mark.parametrize(
    "provider, transport",
    [
        ("efa", "efa"),
        ("efa-direct", "efa"),
        ("tcp;ofi_rxm", "socket"),
        ("sockets", "socket"),
        ("udp;ofi_rxd", "socket"),
        ("verbs;ofi_rxm", "ib"),
        ("shm", "unknown"),
    ],
)
def test_a_libfabric_provider_maps_to_the_transport_it_carries(provider, transport):
    assert provider_transport(provider) == transport


def test_every_transport_a_provider_maps_to_has_a_name_to_show():
    transports = {provider_transport(name) for name in ("efa", "tcp", "verbs", "shm")}
    assert transports <= set(PROVIDER_NAMES)
    assert set(FAMILY_NAMES) == {"socket", "ib", "libfabric"}
