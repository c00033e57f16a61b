"""The Amazon CloudWatch Observability EKS add-on, and the Container Insights metrics it emits that the
stack's dashboard graphs: each name and figure declared once, with its source.

The add-on runs in "Enhanced Container Insights (Classic)" mode, its only mode before 6.0 and its
default from 6.2.0 (the chart's `containerInsights.enabled: true`): the CloudWatch agent, as a DaemonSet on
every node in the host's network namespace (the chart's `agent.hostNetwork: true`), with NVIDIA's
DCGM exporter on the GPU nodes, publishes metrics to the `ContainerInsights` namespace under the
names and dimensions of CloudWatch's metric reference, priced per observation. OTel Container
Insights, the add-on's newer mode, is in preview in five regions that leave out us-east-2 (the
default stack's) and names its metrics after their open-source sources, for PromQL queries (CloudWatch
user guide, "Compare Container Insights approaches" and "Container Insights with OpenTelemetry
metrics for Amazon EKS").
"""

from __future__ import annotations

import re

# The EKS add-on's name (EKS user guide, "Amazon CloudWatch Observability agent").
ADDON_NAME = "amazon-cloudwatch-observability"
# The agent's service account, the one its IAM role trusts (CloudWatch user guide, "Install the
# CloudWatch agent with the Amazon CloudWatch Observability EKS add-on": `eksctl create
# iamserviceaccount --name cloudwatch-agent --namespace amazon-cloudwatch`), and the managed policy
# it needs (same page).
AGENT_NAMESPACE = "amazon-cloudwatch"
AGENT_SERVICE_ACCOUNT = "cloudwatch-agent"
AGENT_POLICY_ARN = "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"

# CloudWatch user guide, "Amazon EKS and Kubernetes Container Insights with enhanced observability
# metrics": the namespace, and the node-level dimensions of each node's GPU and EFA metrics (each
# metric is also published per cluster alone, and per device with `InstanceType` and `GpuDevice`
# or `NetworkInterfaceId`).
METRIC_NAMESPACE = "ContainerInsights"
NODE_DIMENSIONS = ("ClusterName", "InstanceId", "NodeName")

# How the agent publishes them: once per device per collection, and every device's datapoint on
# NODE_DIMENSIONS too; nothing adds a node's devices up before CloudWatch does.
# - GPUs: the DCGM exporter's series are per GPU, the `device` label kept as `GpuDevice`
#   (amazon-contributing/opentelemetry-collector-contrib, receiver/awscontainerinsightreceiver/
#   internal/gpu/dcgmscraper_config.go, the relabel to `ci.AttributeGpuDevice`); the agent's
#   gpuattributes processor keeps `GpuDevice` on node metrics (aws/amazon-cloudwatch-agent,
#   plugins/processors/gpuattributes/processor.go, its "Node" schemas); its EMF declarations give
#   each node GPU metric the sets {ClusterName}, {ClusterName,NodeName,InstanceId} and the per-device
#   one (translator/translate/otel/exporter/awsemf/kubernetes.go, getGPUMetricDeclarations).
# - EFA: one node metric per device (the fork's receiver/awscontainerinsightreceiver/internal/efa/
#   efaSysfs.go, `GetMetrics`: a `nodeMetric` per entry of the store's devices, tagged with the device
#   and its ENI), declared on the same three sets with `NetworkInterfaceId` for the per-device one
#   (kubernetes.go, getEFAMetricDeclarations).
# - The EMF exporter writes one log event per label set, so per device (the fork's
#   exporter/awsemfexporter/grouped_metric.go, `addToGroupedMetric`: grouped by all the labels), and
#   CloudWatch takes one datapoint from each event for each of its dimension sets (CloudWatch user
#   guide, "Specification: Embedded metric format").
# So a node's {ClusterName,InstanceId,NodeName} metric holds one datapoint per device per collection:
# its `Average` is the mean over the devices, its `Sum` over a period of one collection the node's
# total.
#
# The collection interval: the receiver's `CollectionInterval` (the fork's receiver/
# awscontainerinsightreceiver/receiver.go, its ticker), the agent's default 1 minute
# (translator/translate/otel/receiver/awscontainerinsight/utils.go, DefaultMetricsCollectionInterval),
# which the add-on's configuration here leaves as it is (no `metrics_collection_interval`, no
# `accelerated_compute_gpu_metrics_collection_interval`).
COLLECTION_INTERVAL_S = 60

# Same page, "NVIDIA GPU metrics" (add-on v1.3.0 and later): percent, bytes, watts.
GPU_UTILIZATION = "node_gpu_utilization"
GPU_MEMORY_USED = "node_gpu_memory_used"
GPU_POWER_DRAW = "node_gpu_power_draw"
# Same page, "AWS Elastic Fabric Adapter (EFA) metrics" (add-on v1.5.2 and later, with the EFA device
# plugin): bytes received and sent through each EFA device, the sysfs counters rx_bytes and tx_bytes.
# Labelled Bytes/Second (the fork's internal/aws/containerinsight/const.go, `UnitBytesPerSec`), but
# each value is the counter's change since the previous collection (efaSysfs.go, `calculateDelta`:
# `val - prev.RawValue`, not divided by any time; `GetMetrics` runs once a collection, on the
# counters its scraper read last, every 20 s: `defaultCollectionInterval`), so bytes per collection.
EFA_RX_BYTES = "node_efa_rx_bytes"
EFA_TX_BYTES = "node_efa_tx_bytes"
# SRD retransmitted packets and connections that entered an impaired state, per node, with the
# dimensions above: the CloudWatch agent publishes them from its v1.300063.0 (its EMF metric
# declarations, `translator/translate/otel/exporter/awsemf/kubernetes.go`, getEFAMetricDeclarations,
# commit 7ca8d86 "Add EFA Metrics to Container Insights"; none in v1.300062.0), which the add-on
# ships from v5.3.0 (its chart's RELEASE_NOTES: "Upgrade CWAgent to v1.300066.0").
# Each value is the change per collection, as for the bytes. A counter file the node lacks reads as
# 0 (efaSysfs.go, `readUint64ValueFromFile`: `os.IsNotExist` -> 0, nil), so a flat 0 does not tell "no
# retransmits" from "no such counter"; the TrainingRun's `efa_counters` output names the counters
# each worker node has (`training.metrics.efa_sysfs.counter_lines` skips a missing file).
EFA_RETRANSMITTED_PACKETS = "node_efa_retrans_pkts"
EFA_IMPAIRED_CONNECTIONS = "node_efa_impaired_remote_conn_events"

# How a node's value is made from its devices' datapoints of one collection (above): utilisation is
# a mean over the GPUs; memory, power, bytes and events add up over the devices.
NODE_STATISTIC = {
    GPU_UTILIZATION: "Average",
    GPU_MEMORY_USED: "Sum",
    GPU_POWER_DRAW: "Sum",
    EFA_RX_BYTES: "Sum",
    EFA_TX_BYTES: "Sum",
    EFA_RETRANSMITTED_PACKETS: "Sum",
    EFA_IMPAIRED_CONNECTIONS: "Sum",
}

GPU_METRICS = (GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER_DRAW)
EFA_METRICS = (EFA_RX_BYTES, EFA_TX_BYTES, EFA_RETRANSMITTED_PACKETS, EFA_IMPAIRED_CONNECTIONS)
METRICS = (*GPU_METRICS, *EFA_METRICS)

# The oldest add-on version whose agent emits every metric above.
MINIMUM_VERSION = (5, 3, 0)
# Versions 6.0.x and 6.1.x turn OTel Container Insights on by default beside Classic, billed per GB
# besides (the chart's RELEASE_NOTES: 6.0.0 "Introduce OTel Container Insights (enabled by default)",
# 6.2.0 "Disable Otel Container Insights by default").
OTEL_BY_DEFAULT = ((6, 0, 0), (6, 2, 0))

# EKS names add-on builds `v<version>-eksbuild.<n>` (eks:DescribeAddonVersions).
_ADDON_VERSION = re.compile(r"v(\d+)\.(\d+)\.(\d+)-eksbuild\.\d+")


def addon_version_problem(version: str) -> str | None:
    """Why the add-on at `version` does not give the dashboard what it graphs; None when it does."""
    parsed = _ADDON_VERSION.fullmatch(version)
    if parsed is None:
        return f"{ADDON_NAME} {version} is not a version EKS names (v<major>.<minor>.<patch>-eksbuild.<n>)"
    number = tuple(int(part) for part in parsed.groups())
    if number < MINIMUM_VERSION:
        return (
            f"{ADDON_NAME} {version} predates v{'.'.join(map(str, MINIMUM_VERSION))}, the first whose agent "
            f"publishes {EFA_RETRANSMITTED_PACKETS} and {EFA_IMPAIRED_CONNECTIONS}"
        )
    if OTEL_BY_DEFAULT[0] <= number < OTEL_BY_DEFAULT[1]:
        return f"{ADDON_NAME} {version} turns OTel Container Insights on by default, billed per GB besides"
    return None
