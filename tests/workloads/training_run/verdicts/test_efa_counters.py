"""The EFA counter judgement: sysfs lines parsed, deltas per node, and why a node shows no EFA traffic."""

from __future__ import annotations

from tests.harness.fake_kube_api import FakeEfaSysfs
from training.metrics.efa_sysfs import MOVED, read_moved_bytes
from workloads.training_run.access.kube_access import LocalExecutor
from workloads.training_run.verdicts.efa_counters import (
    counters_command,
    efa_counter_delta,
    efa_problems,
    efa_traffic,
    parse_counters,
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
    assert efa_problems(traffic) == [
        "still: 0 bytes sent or received through its 1 EFA port(s)",
        "none: no EFA port counters under /sys/class/infiniband/*/ports/*/hw_counters",
    ]
    reset = efa_traffic({"r": parse_counters(AFTER)}, {"r": parse_counters(BEFORE)})
    assert efa_problems(reset) == ["r: the EFA counters went down between the reads (device reset)"]


def test_the_pod_exec_and_the_training_jobs_own_read_agree_on_the_same_tree(tmp_path):
    """Both readers take the layout from `training.metrics.efa_sysfs`: the exec script's lines, parsed, give
    the bytes the training job's in-process read gives, port by port."""
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    FakeEfaSysfs(tmp_path / "infiniband", device="rdmap32s27").add({"tx_bytes": 5})
    listing = LocalExecutor().run(counters_command(str(sysfs.root)), 10)
    parsed = parse_counters(listing.stdout)
    assert set(parsed) == {"rdmap16s27/1", "rdmap32s27/1"}
    assert read_moved_bytes(str(sysfs.root)) == {
        port: sum(counts[name] for name in MOVED) for port, counts in parsed.items()
    }
    assert read_moved_bytes(str(tmp_path / "no-such-folder")) == {}
