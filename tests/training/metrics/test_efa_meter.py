"""The EFA bytes of each node during a run: read by the node's first rank at every step, logged by
rank 0 beside tokens/s, summed up in the summary; absent, not zero, without EFA. In process, on a
one-rank gloo group and a fake sysfs tree in the EFA driver's layout (`tests.harness.fake_efa_sysfs.FakeEfaSysfs`).
The counters' source and the node's counter server are tests/training/metrics/test_efa_sysfs.py's."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from training.config.run_config import parse_args
from training.metrics.efa_meter import EfaMeter
from training.metrics.efa_sysfs import (
    COUNTERS_URL_ENV,
    SYSFS_ROOT_ENV,
    counter_server,
    counters_source,
)
from training.metrics.report import format_progress_line, format_step_line, parse_step_line
from training.metrics.run_metrics import RunMetrics
from training.model.causal_lm import load_architecture

CPU = torch.device("cpu")
HOST = socket.gethostname()


def test_a_pod_reads_its_nodes_counters_from_the_reader_it_was_told(one_rank_group, tmp_path):
    """On EKS the worker pods get `TRAINING_EFA_COUNTERS_URL`, their node's counter reader: their own
    sysfs shows compat devices without counters (`FakeEfaSysfs.pod_view`), so that URL is the source."""
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    environ = {COUNTERS_URL_ENV: "http://10.0.3.7:9478/", SYSFS_ROOT_ENV: str(sysfs.pod_view)}
    assert counters_source(environ) == "http://10.0.3.7:9478/"
    assert counters_source({SYSFS_ROOT_ENV: str(sysfs.root)}) == str(sysfs.root)  # torchrun on a host
    assert EfaMeter.start(CPU, str(sysfs.pod_view)) is None  # a pod's own sysfs: no meter
    server = counter_server("127.0.0.1", 0, str(sysfs.root))  # the reader DaemonSet's server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        meter = EfaMeter.start(CPU, f"http://127.0.0.1:{server.server_address[1]}/")
        assert meter is not None
        sysfs.add({"tx_bytes": 600, "rx_bytes": 400})
        sample = meter.sample()
        assert sample is not None and sample[HOST] is not None and sample[HOST][0] == 1000
    finally:
        server.shutdown()
        server.server_close()


def test_without_efa_ports_there_is_no_meter(one_rank_group, tmp_path):
    assert EfaMeter.start(CPU, str(tmp_path / "no-such-folder")) is None
    (tmp_path / "empty").mkdir()
    assert EfaMeter.start(CPU, str(tmp_path / "empty")) is None


def test_each_sample_is_what_the_nodes_ports_moved_since_the_last(one_rank_group, tmp_path):
    sysfs = FakeEfaSysfs(tmp_path)
    FakeEfaSysfs(tmp_path, device="rdmap32s27")  # a second EFA device of the node
    meter = EfaMeter.start(CPU, str(tmp_path))
    assert meter is not None and meter.hosts == [HOST]
    sysfs.add({"tx_bytes": 1000, "rx_bytes": 3000, "tx_pkts": 7})  # packets are no bytes
    sample = meter.sample()
    assert sample is not None and sample[HOST] is not None
    moved, seconds = sample[HOST]
    assert moved == 4000 and seconds > 0
    idle = meter.sample()  # nothing moved since
    assert idle is not None and idle[HOST] is not None and idle[HOST][0] == 0
    sysfs.counters["tx_bytes"] -= 10  # a driver reload starts the counters over
    sysfs.add({})
    assert meter.sample() == {HOST: None}


def metrics(*flags: str) -> RunMetrics:
    config = parse_args(["--preset", "tiny", "--steps", "3", *flags])
    return RunMetrics(config, load_architecture(config), CPU, world_size=1, start_step=0)


def test_steps_and_summary_carry_the_bytes_per_node_and_the_share_of_the_line(one_rank_group):
    run = metrics("--line-rate-gbps", "40")
    samples = [
        {HOST: (8e9, 2.0), "node-b": None},
        {HOST: (5e9, 1.0), "node-b": None},
        {HOST: (3e9, 1.0), "node-b": None},
    ]
    records = [
        run.step(step, 2.0, 1.0, 10, 10, lr=1e-3, grad_norm=1.0, eval_loss=None, efa=sample)
        for step, sample in enumerate(samples, start=1)
    ]
    assert records[0].efa_bytes_per_s == {HOST: 4e9, "node-b": None}
    line = format_step_line(records[1])
    assert parse_step_line(line)["efa_bytes_per_s"] == {HOST: 5e9, "node-b": None}
    assert "| EFA 5.00/n/a GB/s" in format_progress_line(records[1])
    summary = run.summary(1, resharded=False).as_dict()
    # The first step's interval is left out, as its time is: (5e9 + 3e9) bytes in 2 s over 2 steps.
    assert summary["efa_bytes_per_s"] == {HOST: 4e9, "node-b": None}
    assert summary["efa_bytes_per_step"] == {HOST: 4e9, "node-b": None}
    assert summary["efa_line_rate_fraction"] == pytest.approx(4e9 * 8 / (2 * 40e9))


def test_without_efa_the_fields_are_absent_not_zero(one_rank_group):
    run = metrics()
    record = run.step(1, 2.0, 1.0, 10, 10, lr=1e-3, grad_norm=1.0, eval_loss=None)
    assert "efa_bytes_per_s" not in record.as_dict()
    assert "efa_bytes_per_s" not in format_step_line(record) and "EFA" not in format_progress_line(record)
    assert "efa_bytes_per_s" not in parse_step_line(format_step_line(record))
    summary = run.summary(1, resharded=False).as_dict()
    assert not {"efa_bytes_per_s", "efa_bytes_per_step", "efa_line_rate_fraction"} & summary.keys()
    with_efa = metrics()  # EFA, but no line rate: no share
    for step in (1, 2):
        with_efa.step(step, 2.0, 1.0, 10, 10, lr=1e-3, grad_norm=1.0, eval_loss=None, efa={HOST: (1.0, 1.0)})
    assert "efa_line_rate_fraction" not in with_efa.summary(1, resharded=False).as_dict()
