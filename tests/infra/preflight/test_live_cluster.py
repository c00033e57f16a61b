"""How the preview finds out whether this machine reaches a private API endpoint: the name resolved,
each address tried, against a listener on this machine (no network beyond it)."""

from __future__ import annotations

import socket

from infra.preflight import live_cluster


def test_an_address_that_listens_accepts_and_one_that_does_not_refuses():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert live_cluster.accepts("127.0.0.1", port)
    assert not live_cluster.accepts("127.0.0.1", port)  # closed: refused at once


def test_a_name_resolves_to_its_addresses_once_each_and_a_bad_one_to_none():
    assert live_cluster.resolve("127.0.0.1", 443) == ["127.0.0.1"]
    assert live_cluster.resolve("eks-ray-train.invalid", 443) == []  # RFC 6761: never resolves
