"""A fake CloudWatch for the dashboard: the datapoints the CloudWatch agent and the training job put
into it, and the dashboard's expressions evaluated over them.

The agent (`FakeAgentNode`) is modelled on its source, Container Insights in its Classic mode as
the add-on runs it (aws/amazon-cloudwatch-agent and its fork, amazon-contributing/
opentelemetry-collector-contrib; `infra.aws_rules.container_insights` cites the same lines):

- once a collection (`COLLECTION_S`, the agent's default: translator/translate/otel/receiver/
  awscontainerinsight/utils.go, `DefaultMetricsCollectionInterval`; the fork's
  receiver/awscontainerinsightreceiver/receiver.go, the ticker of `CollectionInterval`), a datapoint
  per GPU for each node GPU metric, labelled with its `GpuDevice` (the fork's internal/gpu/
  dcgmscraper_config.go, the `device` relabel; the agent's plugins/processors/gpuattributes/
  processor.go keeps the label on node metrics);
- the EFA scraper reads the node's sysfs every `EFA_SCRAPE_S` (the fork's internal/efa/efaSysfs.go,
  `defaultCollectionInterval`, `startScrape`, `scrape`): per device, each counter summed over the
  device's ports (`parseEfaDevice`, `readCounters`), a counter file that does not exist read as 0
  (`readUint64ValueFromFile`: `os.IsNotExist` -> 0, nil);
- once a collection its `GetMetrics` publishes, per device, each counter's change since the
  previous collection (`calculateDelta`: `val - prev.RawValue`; nothing at the first, `prev == nil`),
  stamped with the time of the scrape it read (the `Timestamp` tag of `store.timestamp`);
- each of those datapoints goes to CloudWatch under each dimension set of the agent's EMF
  declarations (translator/translate/otel/exporter/awsemf/kubernetes.go, getGPUMetricDeclarations,
  getEFAMetricDeclarations): the cluster's, the node's {ClusterName, NodeName, InstanceId} and the
  device's; one EMF event per device (the fork's exporter/awsemfexporter/grouped_metric.go,
  `addToGroupedMetric`, groups by every label), one datapoint per event and dimension set (CloudWatch
  user guide, "Specification: Embedded metric format").

The job (`FakeJobMeter`) publishes, each step and per node, what `training.metrics.efa_meter` does:
the bytes the node's EFA ports moved since the last step (`training.metrics.efa_sysfs.read_moved_bytes`,
the job's own reader, over the same sysfs tree) over the step's seconds, as `efa_bytes_per_s` with its
dimensions (`training.metrics.cloudwatch_metrics`).

`FakeCloudWatch.evaluate` computes what a graph shows for the dashboard's expressions, and refuses
any other:

- `SEARCH('{Namespace,Dim,...} MetricName="m" Dim="v"', 'Stat', period)` (CloudWatch user guide,
  "CloudWatch search expression syntax"): the metrics of the namespace whose dimension names are
  exactly the schema's, with the metric name and each `Dim="v"` term exact; an array of time series,
  one per metric found;
- each series holds, for each period (aligned on multiples of the period since the epoch), the
  statistic of the datapoints in it: `Sum`, `Average`, `SampleCount`, `Minimum`, `Maximum` (user
  guide, "CloudWatch concepts", Statistics); a period without datapoints has no value;
- `<array> / <number>` (user guide, "Metric math syntax and functions": an arithmetic operator
  between an array of time series and a scalar applies to each time series, datapoint by datapoint).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from training.metrics import cloudwatch_metrics
from training.metrics.efa_sysfs import read_moved_bytes

COLLECTION_S = 60  # the agent's collection interval
EFA_SCRAPE_S = 20  # efaSysfs.go, defaultCollectionInterval

# The counters the agent's EFA scraper reads, by their sysfs names, and the node metric of each
# (efaSysfs.go `counterNames`, the fork's internal/aws/containerinsight/const.go `EfaRxBytes`...,
# `MetricName` with the `node_efa_` prefix); the retransmit and impaired-connection counters as the
# EMF declarations name their metrics (kubernetes.go, getEFAMetricDeclarations).
EFA_COUNTER_METRICS = {
    "rdma_read_bytes": "node_efa_rdma_read_bytes",
    "rdma_write_bytes": "node_efa_rdma_write_bytes",
    "rdma_write_recv_bytes": "node_efa_rdma_write_recv_bytes",
    "rx_bytes": "node_efa_rx_bytes",
    "rx_drops": "node_efa_rx_dropped",
    "tx_bytes": "node_efa_tx_bytes",
    "retrans_pkts": "node_efa_retrans_pkts",
    "impaired_remote_conn_events": "node_efa_impaired_remote_conn_events",
}
NAMESPACE = "ContainerInsights"


@dataclass(frozen=True)
class MetricKey:
    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]  # sorted by name


Series = dict[tuple[tuple[str, str], ...], list[float | None]]  # each metric found's dimensions -> values


@dataclass
class FakeCloudWatch:
    """Datapoints as CloudWatch stores them: per metric (namespace, name, dimensions), (time, value)."""

    points: dict[MetricKey, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def put(self, namespace: str, name: str, dimensions: Mapping[str, str], at: float, value: float) -> None:
        key = MetricKey(namespace, name, tuple(sorted(dimensions.items())))
        self.points[key].append((at, value))

    def evaluate(self, expression: str, start: float, end: float) -> Series:
        """What a graph of `expression` shows from `start` to `end` (seconds since the epoch), one list
        of values per period for each time series (module doc); an expression of any other form fails."""
        match = _EXPRESSION.fullmatch(expression)
        if match is None:
            raise NotImplementedError(f"the fake evaluates SEARCH(...) [/ number] only, not {expression!r}")
        namespace, *schema = [part.strip() for part in match["schema"].split(",")]
        terms = dict(_TERM.findall(match["terms"]))
        unmatched = _TERM.sub("", match["terms"]).strip()
        if unmatched or "MetricName" not in terms:
            raise NotImplementedError(
                f'the fake searches by MetricName and Dim="value" terms only: {unmatched!r}'
            )
        statistic = _STATISTICS[match["stat"]]
        period = int(match["period"])
        divisor = float(match["divisor"]) if match["divisor"] else 1.0
        starts = range(int(start) // period * period, int(end), period)
        found: Series = {}
        for key, points in self.points.items():
            dimensions = dict(key.dimensions)
            if (
                key.namespace != namespace
                or sorted(dimensions) != sorted(schema)
                or key.name != terms["MetricName"]
                or any(dimensions.get(name) != value for name, value in terms.items() if name != "MetricName")
            ):
                continue
            values: list[float | None] = []
            for begin in starts:
                inside = [value for at, value in points if begin <= at < begin + period]
                values.append(statistic(inside) / divisor if inside else None)
            found[key.dimensions] = values
        return found


_EXPRESSION = re.compile(
    r"SEARCH\('\{(?P<schema>[^}]+)\}(?P<terms>[^']*)', '(?P<stat>\w+)', (?P<period>\d+)\)"
    r"(?: / (?P<divisor>\d+(?:\.\d+)?))?"
)
_TERM = re.compile(r'(\w+)="([^"]*)"')
_STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "Sum": sum,
    "Average": statistics.fmean,
    "SampleCount": len,
    "Minimum": min,
    "Maximum": max,
}


@dataclass(frozen=True)
class FakeGpu:
    """One GPU as DCGM reads it: percent busy, bytes of memory used, watts."""

    utilization: float
    memory_used: float
    power_draw: float


@dataclass
class FakeAgentNode:
    """The CloudWatch agent on one GPU node (module doc): its GPUs, its EFA devices' sysfs under
    `efa_root` (`tests.harness.fake_efa_sysfs.FakeEfaSysfs` trees), and each device's ENI."""

    cloudwatch: FakeCloudWatch
    cluster: str
    node: str
    instance_id: str
    instance_type: str
    gpus: Sequence[FakeGpu] = ()
    efa_root: Path | None = None
    enis: Mapping[str, str] = field(default_factory=dict)  # EFA device -> its ENI (NetworkInterfaceId)
    _store: tuple[float, dict[str, dict[str, int]]] | None = None  # the last scrape: its time, per device
    _previous: dict[tuple[str, str], int] = field(default_factory=dict)  # calculateDelta's cache

    def _dimension_sets(self, device_key: str, device: str) -> list[dict[str, str]]:
        node = {"ClusterName": self.cluster, "NodeName": self.node, "InstanceId": self.instance_id}
        return [
            {"ClusterName": self.cluster},
            node,
            {**node, "InstanceType": self.instance_type, device_key: device},
        ]

    def scrape_efa(self, now: float) -> None:
        """efaSysfs.go `scrape`: every device's counters, each summed over its ports."""
        assert self.efa_root is not None
        devices: dict[str, dict[str, int]] = {}
        for device in sorted(path for path in self.efa_root.iterdir() if path.is_dir()):
            counters = dict.fromkeys(EFA_COUNTER_METRICS, 0)
            for port in sorted(path for path in (device / "ports").iterdir() if path.is_dir()):
                for counter in counters:
                    file = port / "hw_counters" / counter
                    counters[counter] += int(file.read_text()) if file.exists() else 0
            devices[device.name] = counters
        self._store = (now, devices)

    def collect(self, now: float) -> None:
        """The receiver's collection: the GPUs' datapoints, and the EFA scraper's `GetMetrics`."""
        for index, gpu in enumerate(self.gpus):
            for dimensions in self._dimension_sets("GpuDevice", f"nvidia{index}"):
                self.cloudwatch.put(NAMESPACE, "node_gpu_utilization", dimensions, now, gpu.utilization)
                self.cloudwatch.put(NAMESPACE, "node_gpu_memory_used", dimensions, now, gpu.memory_used)
                self.cloudwatch.put(NAMESPACE, "node_gpu_power_draw", dimensions, now, gpu.power_draw)
        if self._store is None:
            return
        scraped_at, devices = self._store
        for device, counters in devices.items():
            for counter, value in counters.items():
                previous = self._previous.get((device, counter))
                self._previous[(device, counter)] = value
                if previous is None:
                    continue
                for dimensions in self._dimension_sets("NetworkInterfaceId", self.enis.get(device, "")):
                    metric = EFA_COUNTER_METRICS[counter]
                    self.cloudwatch.put(NAMESPACE, metric, dimensions, scraped_at, value - previous)


@dataclass
class FakeJobMeter:
    """The training job's rank 0 publishing one node's `efa_bytes_per_s` each step (module doc)."""

    cloudwatch: FakeCloudWatch
    cluster: str
    run: str
    host: str
    efa_root: Path
    _last: tuple[float, int] | None = None

    def step(self, now: float) -> None:
        moved = sum(read_moved_bytes(str(self.efa_root)).values())
        if self._last is not None:
            at, before = self._last
            dimensions = {
                cloudwatch_metrics.CLUSTER_DIMENSION: self.cluster,
                cloudwatch_metrics.RUN_DIMENSION: self.run,
                cloudwatch_metrics.HOST_DIMENSION: self.host,
            }
            rate = (moved - before) / (now - at)
            self.cloudwatch.put(
                cloudwatch_metrics.NAMESPACE, cloudwatch_metrics.EFA_METRIC, dimensions, now, rate
            )
        self._last = (now, moved)
