"""The job's numbers in CloudWatch, beside the nodes' Container Insights metrics: rank 0 publishes
each step's tokens/s, loss, MFU, step time and each node's EFA bytes/s, each restart and the steps it
lost, and the fabric gate's probe its busbw (names, units and dimensions in `training.metrics.cloudwatch_metrics`).

Publishing never slows or stops training. A step only appends its data points to a list; a
background thread sends them with `PutMetricData` every `FLUSH_SECONDS` (or sooner when
`BATCH_DATUMS` wait), at most `MAX_DATUMS_PER_REQUEST` a request. A request that fails is dropped
with one warning for the whole run (no credentials, no network, a refused namespace), and training
goes on; later failures are not reported again. The client is made on that thread, with short
timeouts, and the last step waits at most `CLOSE_SECONDS` for the last request.

Nothing is published, and nothing is said, without the cluster's name in the environment
(`CLUSTER_NAME_ENV`, which the RayCluster sets while the stack's `observability` key is on) or with
`--local`.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from training.config.run_config import TrainConfig
from training.metrics.cloudwatch_metrics import (
    BUSBW_METRIC,
    BUSBW_UNIT,
    CLUSTER_DIMENSION,
    CLUSTER_NAME_ENV,
    COLLECTIVE_DIMENSION,
    EFA_METRIC,
    EFA_UNIT,
    HOST_DIMENSION,
    LOST_STEPS_METRIC,
    NAMESPACE,
    RESTART_METRICS,
    RESTARTS_METRIC,
    RUN_DIMENSION,
    STEP_METRICS,
)
from training.metrics.report import StepMetrics

# PutMetricData takes at most 1,000 metrics a request (CloudWatch API Reference, "PutMetricData").
MAX_DATUMS_PER_REQUEST = 1000
FLUSH_SECONDS = 10.0
BATCH_DATUMS = 500
# Data points held while requests fail or hang; the oldest go first beyond it.
PENDING_LIMIT = 20_000
CLOSE_SECONDS = 10.0
# botocore's timeouts and attempts for each request: a hung endpoint costs the thread seconds, not the run.
CLIENT_CONFIG = {
    "connect_timeout": 3,
    "read_timeout": 5,
    "retries": {"max_attempts": 2, "mode": "standard"},
}

Datum = dict[str, Any]


def cloudwatch_client(region: str | None) -> Any:
    """A CloudWatch client with bounded timeouts (boto3 is imported here, on the sink's thread)."""
    import boto3
    import botocore.config

    return boto3.client("cloudwatch", region_name=region, config=botocore.config.Config(**CLIENT_CONFIG))


def _dimensions(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Name": name, "Value": value} for name, value in values.items()]


def _datum(
    name: str, value: float | None, unit: str, dimensions: Mapping[str, str], at: datetime.datetime
) -> list[Datum]:
    """One data point, or none for a value CloudWatch cannot hold (absent, NaN, infinite)."""
    if value is None or not math.isfinite(value):
        return []
    return [
        {
            "MetricName": name,
            "Dimensions": _dimensions(dimensions),
            "Timestamp": at,
            "Value": float(value),
            "Unit": unit,
        }
    ]


def step_datums(record: StepMetrics, cluster: str, run: str, at: datetime.datetime) -> list[Datum]:
    """A step's data points: the run's numbers, then each node's EFA bytes/s."""
    run_dimensions = {CLUSTER_DIMENSION: cluster, RUN_DIMENSION: run}
    datums = [
        datum
        for name, unit in STEP_METRICS.items()
        for datum in _datum(name, getattr(record, name), unit, run_dimensions, at)
    ]
    for host, rate in sorted((record.efa_bytes_per_s or {}).items()):
        datums += _datum(EFA_METRIC, rate, EFA_UNIT, {**run_dimensions, HOST_DIMENSION: host}, at)
    return datums


def restart_datums(lost_steps: int, cluster: str, run: str, at: datetime.datetime) -> list[Datum]:
    """A restart's data points: one restart, and the steps it lost."""
    run_dimensions = {CLUSTER_DIMENSION: cluster, RUN_DIMENSION: run}
    values = {RESTARTS_METRIC: 1, LOST_STEPS_METRIC: lost_steps}
    return [
        datum
        for name, unit in RESTART_METRICS.items()
        for datum in _datum(name, values[name], unit, run_dimensions, at)
    ]


def busbw_datums(report: Mapping[str, Any], cluster: str, at: datetime.datetime) -> list[Datum]:
    """The probe's busbw per collective at the largest message size it timed."""
    rows: dict[str, Mapping[str, Any]] = {}
    for row in report.get("results", []):
        if row["bytes"] >= rows.get(row["collective"], {"bytes": -1})["bytes"]:
            rows[row["collective"]] = row
    return [
        datum
        for collective, row in sorted(rows.items())
        for datum in _datum(
            BUSBW_METRIC,
            row["busbw_gbps"],
            BUSBW_UNIT,
            {CLUSTER_DIMENSION: cluster, COLLECTIVE_DIMENSION: collective},
            at,
        )
    ]


def _warn_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CloudWatchSink:
    """Data points handed over without waiting, sent in batches by one background thread."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        *,
        flush_seconds: float = FLUSH_SECONDS,
        warn: Callable[[str], None] = _warn_on_stderr,
    ) -> None:
        self._client_factory, self._flush_seconds, self._warn = client_factory, flush_seconds, warn
        self._pending: list[Datum] = []
        self._ready = threading.Condition()
        self._closing = False
        self._warned = False
        self.requests = 0  # PutMetricData calls that succeeded
        self._thread = threading.Thread(target=self._send_loop, name="cloudwatch-sink", daemon=True)
        self._thread.start()

    def put(self, datums: Iterable[Datum]) -> None:
        """Hand data points over; returns at once, whatever CloudWatch does."""
        with self._ready:
            if self._closing:
                return
            self._pending.extend(datums)
            del self._pending[:-PENDING_LIMIT]
            if len(self._pending) >= BATCH_DATUMS:
                self._ready.notify()

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Send what is left, waiting at most `timeout` seconds."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout)

    def _send_loop(self) -> None:
        client = None
        while True:
            with self._ready:
                if not self._closing and len(self._pending) < BATCH_DATUMS:
                    self._ready.wait(self._flush_seconds)
                batch, self._pending = self._pending, []
                closing = self._closing
            for start in range(0, len(batch), MAX_DATUMS_PER_REQUEST):
                try:
                    client = client or self._client_factory()
                    client.put_metric_data(
                        Namespace=NAMESPACE, MetricData=batch[start : start + MAX_DATUMS_PER_REQUEST]
                    )
                    self.requests += 1
                except Exception as error:  # any failure: the points are dropped, training goes on
                    self._warn_once(error)
            if closing:
                return

    def _warn_once(self, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            self._warn(
                f"warning: CloudWatch metrics not published ({type(error).__name__}: {error}); "
                f"training goes on, and later failures to publish to namespace {NAMESPACE} are not reported"
            )


# The sink of each run in this process (the run's rank 0), made on its first step.
_RUN_SINKS: dict[str, CloudWatchSink] = {}


def _cluster_name(environ: Mapping[str, str]) -> str | None:
    return environ.get(CLUSTER_NAME_ENV) or None


def _run_sink(
    config: TrainConfig, environ: Mapping[str, str], client_factory: Callable[[], Any] | None
) -> CloudWatchSink:
    sink = _RUN_SINKS.get(config.run_name)
    if sink is None:
        factory = client_factory or (lambda: cloudwatch_client(environ.get("AWS_REGION")))
        sink = _RUN_SINKS[config.run_name] = CloudWatchSink(factory)
    return sink


def publish_step(
    config: TrainConfig,
    record: StepMetrics,
    environ: Mapping[str, str] = os.environ,
    client_factory: Callable[[], Any] | None = None,
) -> None:
    """Rank 0's hook in the loop, once a step: the step's data points to CloudWatch; the run's last
    step sends what is left. Nothing without the cluster's name in the environment or with --local."""
    cluster = _cluster_name(environ)
    if cluster is None or config.local:
        return
    sink = _run_sink(config, environ, client_factory)
    sink.put(step_datums(record, cluster, config.run_name, datetime.datetime.now(datetime.UTC)))
    if record.step >= record.steps:
        _RUN_SINKS.pop(config.run_name).close()


def publish_restart(
    config: TrainConfig,
    lost_steps: int,
    environ: Mapping[str, str] = os.environ,
    client_factory: Callable[[], Any] | None = None,
) -> None:
    """The restarted rank 0's hook, once, after its first step: the restart and the steps it lost,
    through the run's sink (sent with the steps'). Nothing without the cluster's name or with --local."""
    cluster = _cluster_name(environ)
    if cluster is None or config.local:
        return
    sink = _run_sink(config, environ, client_factory)
    sink.put(restart_datums(lost_steps, cluster, config.run_name, datetime.datetime.now(datetime.UTC)))


def publish_busbw(
    report: Mapping[str, Any] | None,
    environ: Mapping[str, str] = os.environ,
    client_factory: Callable[[], Any] | None = None,
) -> None:
    """The fabric probe's hook, once its report is printed: each collective's busbw to CloudWatch,
    waiting at most `CLOSE_SECONDS`. Nothing without the cluster's name in the environment."""
    cluster = _cluster_name(environ)
    if cluster is None or report is None:
        return
    sink = CloudWatchSink(client_factory or (lambda: cloudwatch_client(environ.get("AWS_REGION"))))
    sink.put(busbw_datums(report, cluster, datetime.datetime.now(datetime.UTC)))
    sink.close()
