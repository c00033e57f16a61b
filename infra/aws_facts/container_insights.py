"""The Amazon CloudWatch Observability EKS add-on, and the Container Insights metrics it emits that the
stack's dashboard graphs: each fact declared once, with its source.

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
# metrics": the namespace, and the dimensions of each node's GPU and EFA metrics summed or averaged
# over its devices (each metric is also published per cluster alone, and per device with
# `InstanceType` and `GpuDevice` or `NetworkInterfaceId`).
METRIC_NAMESPACE = "ContainerInsights"
NODE_DIMENSIONS = ("ClusterName", "InstanceId", "NodeName")
# Same page, "NVIDIA GPU metrics" (add-on v1.3.0 and later): percent, bytes, watts.
GPU_UTILIZATION = "node_gpu_utilization"
GPU_MEMORY_USED = "node_gpu_memory_used"
GPU_POWER_DRAW = "node_gpu_power_draw"
# Same page, "AWS Elastic Fabric Adapter (EFA) metrics" (add-on v1.5.2 and later, with the EFA device
# plugin): bytes per second through the node's EFA devices.
EFA_RX_BYTES = "node_efa_rx_bytes"
EFA_TX_BYTES = "node_efa_tx_bytes"
# SRD retransmitted packets and connections that entered an impaired state, per node, with the
# dimensions above: the CloudWatch agent publishes them from its v1.300065.0 (its EMF metric
# declarations, `translator/translate/otel/exporter/awsemf/kubernetes.go`, getEFAMetricDeclarations),
# which the add-on ships from v5.3.0 (its chart's RELEASE_NOTES: "Upgrade CWAgent to v1.300066.0").
EFA_RETRANSMITTED_PACKETS = "node_efa_retrans_pkts"
EFA_IMPAIRED_CONNECTIONS = "node_efa_impaired_remote_conn_events"

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
