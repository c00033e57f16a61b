"""The EFA counters read by exec in a node's counter reader pod: the exec's lines and the job's own read agree."""

from __future__ import annotations

import sys

from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from training.metrics.efa_sysfs import MOVED, parse_counters, read_moved_bytes
from workloads.efa_counter_reader import counters_command
from workloads.training_run.access.commands import LocalExecutor


def test_the_reader_pods_exec_and_the_training_jobs_own_read_agree_on_the_same_tree(tmp_path):
    """Both readers run `training.metrics.efa_sysfs`: the exec's lines, parsed, give the bytes the
    training job's in-process read gives, port by port."""
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    FakeEfaSysfs(tmp_path / "infiniband", device="rdmap32s27").add({"tx_bytes": 5})
    argv = counters_command()
    listing = LocalExecutor().run([sys.executable, *argv[1:-1], str(sysfs.root)], 10)
    parsed = parse_counters(listing.stdout)
    assert set(parsed) == {"rdmap16s27/1", "rdmap32s27/1"}
    assert read_moved_bytes(str(sysfs.root)) == {
        port: sum(counts.get(name, 0) for name in MOVED) for port, counts in parsed.items()
    }
    assert read_moved_bytes(str(tmp_path / "no-such-folder")) == {}
    assert read_moved_bytes(str(sysfs.pod_view)) == {}  # a pod's own view: compat devices, no counters
