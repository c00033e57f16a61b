"""The EFA counter judgement: counter lines parsed, deltas per node, why a node shows no EFA traffic,
and which nodes could not be read."""

from __future__ import annotations

import json

from training.metrics.efa_sysfs import MOVED, parse_counters
from workloads.training_run.verdicts.efa_counters import (
    ANY_TRAFFIC,
    EfaTraffic,
    MovedFloor,
    baseline_floor,
    efa_counter_delta,
    efa_problems,
    efa_traffic,
    probe_floor,
    tcp_leak_problems,
    traffic_from_record,
    traffic_record,
)

BEFORE = "rdmap16s27/ports/1/hw_counters/tx_bytes 1000\nrdmap16s27/ports/1/hw_counters/rx_bytes 2000\n"
AFTER = "rdmap16s27/ports/1/hw_counters/tx_bytes 5000\nrdmap16s27/ports/1/hw_counters/rx_bytes 2500\n"


def test_sysfs_lines_parse_per_device_port():
    assert parse_counters(BEFORE + "garbage line\n") == {"rdmap16s27/1": {"tx_bytes": 1000, "rx_bytes": 2000}}


def test_the_delta_sums_a_nodes_ports():
    before = {"a/1": {"tx_bytes": 10}, "b/1": {"tx_bytes": 5}}
    after = {"a/1": {"tx_bytes": 30}, "b/1": {"tx_bytes": 15}}
    assert efa_counter_delta(before, after) == {"tx_bytes": 30}


def test_a_counter_that_went_down_or_a_new_port_makes_the_delta_unknown():
    assert efa_counter_delta({"a/1": {"tx_bytes": 10}}, {"a/1": {"tx_bytes": 3}}) is None
    assert efa_counter_delta({}, {"a/1": {"tx_bytes": 3}}) is None


def test_bytes_moved_and_the_problems_of_each_node():
    before = {"moved": parse_counters(BEFORE), "still": parse_counters(BEFORE), "none": {}}
    after = {"moved": parse_counters(AFTER), "still": parse_counters(BEFORE), "none": {}}
    traffic = efa_traffic(before, after)
    assert traffic.bytes_moved() == {"moved": 4500, "still": 0, "none": 0}
    assert efa_problems(traffic, ANY_TRAFFIC) == [
        "still: 0 bytes sent or received through its 1 EFA port(s)",
        "none: its node shows no EFA port counters in the host's network namespace "
        "(/sys/class/infiniband/*/ports/*/hw_counters is empty there)",
    ]
    reset = efa_traffic({"r": parse_counters(AFTER)}, {"r": parse_counters(BEFORE)})
    assert efa_problems(reset, ANY_TRAFFIC) == [
        "r: the EFA counters went down between the reads (device reset)"
    ]


def test_counters_that_could_not_be_read_are_unavailable_and_fail_never_pass():
    """A node without a reader pod, or whose read failed, says why: it is not a node whose counters
    did not move, and it is no pass either (a check that cannot measure fails); the nodes that were
    read are judged beside it."""
    why = "no running efa-counters pod on node node-b"
    traffic = efa_traffic({"a": parse_counters(BEFORE), "b": why}, {"a": parse_counters(BEFORE), "b": why})
    assert traffic.unavailable == {"b": why} and traffic.bytes_moved() == {"a": 0, "b": None}
    assert efa_problems(traffic, ANY_TRAFFIC) == [
        f"b: its node's EFA counters could not be read: {why}",
        "a: 0 bytes sent or received through its 1 EFA port(s)",
    ]
    assert traffic.unavailable_note() == f"EFA counters unavailable for b: {why}"
    late = efa_traffic({"a": parse_counters(BEFORE)}, {"a": "reading them failed (exit 1)"})
    assert late.unavailable == {"a": "reading them failed (exit 1)"}
    assert efa_problems(late, ANY_TRAFFIC) == [
        "a: its node's EFA counters could not be read: reading them failed (exit 1)"
    ]


GIB = 1 << 30


def test_a_node_that_moved_only_handshakes_is_under_the_probes_floor():
    """The probe must bring at least 12 GiB into each node; half of that is the floor. 64 KiB of
    connection set-up is far under it, and the line names the numbers and their basis."""
    floor = probe_floor(12 * GIB)
    assert floor is not None and floor.bytes == 6 * GIB
    traffic = EfaTraffic(
        {"a": 1, "b": 1},
        {
            "a": {"tx_bytes": 32_768, "rx_bytes": 32_768},
            "b": {"tx_bytes": 4 * GIB, "rdma_read_bytes": 3 * GIB},
        },
    )
    assert efa_problems(traffic, floor) == [
        f"a: 65536 bytes moved through its 1 EFA port(s), under {6 * GIB} "
        f"(0.5 of the {12 * GIB} bytes the probe's collectives must bring into each node)"
    ]
    assert probe_floor(None) is None


def test_rdma_bytes_count_as_moved():
    """RDMA read and write payload counts, whether or not the device's tx/rx_bytes hold it."""
    rdma_only = EfaTraffic({"a": 1}, {"a": {name: 1 for name in MOVED if name.startswith("rdma_")}})
    assert rdma_only.bytes_moved() == {"a": 4} and efa_problems(rdma_only, MovedFloor(4, "four")) == []


def test_a_tcp_baseline_whose_efa_counters_moved_like_an_efa_run_is_no_baseline():
    efa_run = EfaTraffic({"a": 1, "b": 1}, {"a": {"tx_bytes": 10 * GIB}, "b": {"tx_bytes": 8 * GIB}})
    floor = baseline_floor(efa_run)
    assert floor is not None and floor.bytes == 4 * GIB
    quiet = EfaTraffic({"a": 1, "b": 1}, {"a": {"tx_bytes": 65_536}, "b": {}})
    assert tcp_leak_problems(quiet, floor) == []
    leaked = EfaTraffic(
        {"a": 1, "b": 1}, {"a": {"tx_bytes": 65_536}, "b": {"rx_bytes": GIB, "tx_bytes": 3 * GIB}}
    )
    assert tcp_leak_problems(leaked, floor) == [
        f"b: {4 * GIB} bytes moved through its EFA port(s), at least {4 * GIB} "
        f"(0.5 of the {8 * GIB} bytes a node's EFA ports moved in the EFA run of the same job)"
    ]
    unread = EfaTraffic({}, {}, {"a": "no running efa-counters pod on node node-a"})
    assert tcp_leak_problems(unread, floor) == [
        "a: its node's EFA counters could not be read: no running efa-counters pod on node node-a"
    ]
    assert baseline_floor(unread) is None


def test_the_recorded_traffic_is_the_traffic():
    """What is recorded beside a job (JSON, in the head pod) is judged again exactly as measured."""
    traffic = efa_traffic(
        {"a": parse_counters(BEFORE), "b": "unread"}, {"a": parse_counters(AFTER), "b": "unread"}
    )
    again = traffic_from_record(json.loads(json.dumps(traffic_record(traffic))))
    assert again == traffic and efa_problems(again, ANY_TRAFFIC) == efa_problems(traffic, ANY_TRAFFIC)


def test_a_worker_pod_replaced_during_the_job_is_not_judged_and_the_node_read_on_both_sides_is():
    """A lost node's pod (or one a node taken out of the job had) is gone after the job and its
    replacement was not there before: neither can be read on both sides, so each says so, and the node
    that was is judged. A run whose every pod was replaced has nothing read on both sides: it fails."""
    before = {"worker-a": parse_counters(BEFORE), "worker-b": parse_counters(BEFORE)}
    after = {"worker-c": parse_counters(AFTER), "worker-b": parse_counters(AFTER)}
    traffic = efa_traffic(before, after)
    assert traffic.unavailable == {} and set(traffic.replaced) == {"worker-a", "worker-c"}
    assert traffic.bytes_moved() == {"worker-b": 4500, "worker-a": None, "worker-c": None}
    assert efa_problems(traffic, ANY_TRAFFIC) == []
    assert traffic.unmeasured()["worker-a"].startswith("replaced during the job")
    again = traffic_from_record(json.loads(json.dumps(traffic_record(traffic))))
    assert again == traffic
    older = traffic_record(traffic)
    del older["replaced"]  # a record of an older release
    assert traffic_from_record(older).replaced == {}
    every = efa_traffic({"worker-a": parse_counters(BEFORE)}, {"worker-c": parse_counters(AFTER)})
    [problem] = efa_problems(every, ANY_TRAFFIC)
    assert problem.startswith("no worker node's EFA counters were read both before and after the job")
