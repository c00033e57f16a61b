"""The EFA counters' source and their counter server: the sysfs root or the node's reader URL a
process reads from, an IPv6 node address bracketed in it, and the server as the reader DaemonSet
runs it (`python -c <source> serve ADDRESS PORT ROOT`, `tests.harness.counter_reader`): a client
that sends nothing holds back no read, and it serves on an IPv6 node address."""

from __future__ import annotations

import socket
import time

import pytest

from tests.harness.counter_reader import has_ipv6_loopback, running_reader
from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from training.metrics.efa_sysfs import (
    COUNTERS_URL_ENV,
    REQUEST_TIMEOUT_S,
    SYSFS_ROOT_ENV,
    bracketed,
    counters_source,
    read_counters,
    sysfs_root,
)


def test_the_root_is_the_drivers_unless_the_environment_points_elsewhere():
    assert sysfs_root({}) == "/sys/class/infiniband"
    assert sysfs_root({SYSFS_ROOT_ENV: "/tmp/fake"}) == "/tmp/fake"


def test_a_client_that_sends_nothing_holds_back_no_read(tmp_path):
    """A client that connects and sends nothing (a stuck scraper, a half-open probe) keeps only its
    own connection's thread, which gives up after `REQUEST_TIMEOUT_S`; a read beside it answers at once."""
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    with (
        running_reader(sysfs.root, "127.0.0.1") as reader,
        socket.create_connection((reader.host, reader.port)) as silent,
    ):
        started = time.monotonic()
        counters = read_counters(reader.url)
        assert time.monotonic() - started < 1
        assert counters == read_counters(str(sysfs.root)) != {}
        silent.settimeout(REQUEST_TIMEOUT_S + 10)
        assert silent.recv(1) == b""  # dropped, not served and not held open


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_reader_serves_on_an_ipv6_node_address(tmp_path):
    """On an IPv6 cluster `status.hostIP` is an IPv6 address: the server listens on it, and the URL
    the kubelet writes with it (unbracketed) reads once bracketed."""
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    with running_reader(sysfs.root, "::1") as reader:
        url = counters_source({COUNTERS_URL_ENV: reader.url})
        assert url == f"http://[::1]:{reader.port}/"
        assert read_counters(url) == read_counters(str(sysfs.root)) != {}


def test_only_an_unbracketed_ipv6_host_is_bracketed():
    assert bracketed("http://2600:1f14:abc::7:9478/") == "http://[2600:1f14:abc::7]:9478/"
    assert bracketed("http://10.0.3.7:9478/") == "http://10.0.3.7:9478/"
    assert bracketed("http://[2600:1f14:abc::7]:9478/") == "http://[2600:1f14:abc::7]:9478/"
    assert bracketed("/sys/class/infiniband") == "/sys/class/infiniband"
