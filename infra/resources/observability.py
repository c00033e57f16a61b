"""See the run: the CloudWatch Observability EKS add-on on every node, the Ray pods' right to publish
the job's metrics, and one dashboard with the nodes' GPU and EFA metrics beside the training's.

The add-on (Container Insights with enhanced observability, `infra.aws_rules.container_insights`)
collects each node's GPU metrics through NVIDIA's DCGM exporter and its EFA counters in the host's
network namespace; its agent assumes its own role through the cluster's OIDC provider (IRSA, as the
Ray pods do for the checkpoints). The job publishes its own numbers with `PutMetricData`
(`training.metrics.cloudwatch_sink`) as the Ray pods' role, which may write to the job's namespace
and no other. Everything here is the stack key `observability`; off, none of it exists.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.aws_rules.container_insights import (
    ADDON_NAME,
    AGENT_NAMESPACE,
    AGENT_POLICY_ARN,
    AGENT_SERVICE_ACCOUNT,
    COLLECTION_INTERVAL_S,
    EFA_IMPAIRED_CONNECTIONS,
    EFA_RETRANSMITTED_PACKETS,
    EFA_RX_BYTES,
    EFA_TX_BYTES,
    GPU_MEMORY_USED,
    GPU_POWER_DRAW,
    GPU_UTILIZATION,
    METRIC_NAMESPACE,
    NODE_DIMENSIONS,
    NODE_STATISTIC,
    addon_version_problem,
)
from infra.aws_rules.live_stack import LiveCluster
from infra.config.parsing import ConfigError
from infra.resources.cluster import addon_version
from infra.resources.irsa import irsa_role
from platform_contract import GPU_TOLERATION
from training.metrics import cloudwatch_metrics as job

# Every graph's period: the agent's collection interval, so that one period holds one collection of
# each of a node's devices, and a period's `Sum` of a node's GPU memory or power is the node's total
# (`infra.aws_rules.container_insights`: one datapoint per device per collection).
PERIOD_S = COLLECTION_INTERVAL_S
GRID_COLUMNS = 24  # a dashboard's grid (CloudWatch API Reference, "Dashboard Body Structure and Syntax")
WIDGET_WIDTH, WIDGET_HEIGHT, HEADER_HEIGHT = 8, 6, 4


def addon_configuration() -> dict[str, Any]:
    """The add-on's configuration values (the same keys as its Helm chart's values.yaml).

    - `tolerations`: the add-on's DaemonSets (the agent, DCGM exporter) run on the GPU nodes, which
      carry the GPU taint; DaemonSets tolerate the node-condition taints by themselves. Set here
      rather than left to the add-on's default, so the GPU nodes are covered whatever that default is.
    - `containerLogs`: no Fluent Bit; every container's stdout would go to CloudWatch Logs, billed
      per GB (the job's logs stay in Ray's session folder, where the verdict reads them).
    - `agent.config`: Container Insights with enhanced observability and its accelerated-compute
      (GPU, EFA) metrics, and nothing else (no Application Signals); the add-on adds the cluster's
      name (CloudWatch user guide, "Install the CloudWatch agent with the Amazon CloudWatch
      Observability EKS add-on", "(Optional) Additional configuration").
    """
    return {
        "tolerations": [dict(GPU_TOLERATION)],
        "containerLogs": {"enabled": False},
        "agent": {
            "config": {
                "logs": {
                    "metrics_collected": {
                        "kubernetes": {
                            "enhanced_container_insights": True,
                            "accelerated_compute_metrics": True,
                        }
                    }
                }
            }
        },
    }


def checked_addon_version(kubernetes_version: str, live: LiveCluster | None) -> str:
    """The add-on's version, kept as CoreDNS's is (`infra.resources.cluster.addon_version`), refused
    at preview when it would not give the dashboard its metrics."""
    version = addon_version(ADDON_NAME, kubernetes_version, live)
    problem = addon_version_problem(version)
    if problem:
        raise ConfigError(
            f"config key 'observability': {problem} (the version for kubernetesVersion {kubernetes_version}: "
            "the cluster's, or the newest EKS offers): set a kubernetesVersion EKS offers a later build "
            "for, or observability: false"
        )
    return version


def put_metric_data_policy() -> str:
    """The Ray pods may publish metrics to the job's namespace, nothing else: PutMetricData takes no
    resource ARN, and the `cloudwatch:namespace` condition key limits it to one namespace (Service
    Authorization Reference, "Actions, resources, and condition keys for Amazon CloudWatch")."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PublishTheJobsMetrics",
                    "Effect": "Allow",
                    "Action": "cloudwatch:PutMetricData",
                    "Resource": "*",
                    "Condition": {"StringEquals": {"cloudwatch:namespace": job.NAMESPACE}},
                }
            ],
        }
    )


def dashboard_name(cluster_name: str, region: str) -> str:
    """Dashboards are global to the account (CloudFormation, AWS::CloudWatch::Dashboard), and every
    stack file's cluster is `eks-ray-train` by default: the region keeps the stacks apart."""
    return f"{cluster_name}-{region}"


def dashboard_url(name: str, region: str) -> str:
    """The dashboard in the CloudWatch console."""
    return (
        f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{name}"
    )


def search(namespace: str, dimensions: Sequence[str], metric: str, cluster_name: str, stat: str) -> str:
    """A search expression: one line per value of the other dimensions (a node, a run, a collective)
    of `metric` in this cluster (CloudWatch user guide, "CloudWatch search expression syntax")."""
    schema = ",".join([namespace, *dimensions])
    return (
        f'SEARCH(\'{{{schema}}} MetricName="{metric}" {job.CLUSTER_DIMENSION}="{cluster_name}"\', '
        f"'{stat}', {PERIOD_S})"
    )


def _metric_widget(
    title: str, expressions: Sequence[str], region: str, *, view: str = "timeSeries", unit: str | None = None
) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "title": title,
        "view": view,
        "region": region,
        "period": PERIOD_S,
        "metrics": [
            [{"expression": expression, "id": f"e{index}"}] for index, expression in enumerate(expressions, 1)
        ],
    }
    if view == "timeSeries":
        properties["stacked"] = False
    if unit:
        properties["yAxis"] = {"left": {"label": unit, "showUnits": False}}
    return {"type": "metric", "width": WIDGET_WIDTH, "height": WIDGET_HEIGHT, "properties": properties}


def dashboard_body(cluster_name: str, region: str, addon_version: str) -> dict[str, Any]:
    """The dashboard: the nodes' GPU and EFA metrics, then the run's, a row of three each; last, the
    run's restarts."""

    def nodes(metric: str, per_second: bool = False) -> str:
        """Each node's value over its devices (`NODE_STATISTIC`). `per_second`: a metric of changes per
        collection, whose period's `Sum` is what the node's devices counted in it, over the period's
        seconds (CloudWatch user guide, "Metric math syntax and functions": an arithmetic operator
        between an array of time series and a scalar applies to each series)."""
        found = search(METRIC_NAMESPACE, NODE_DIMENSIONS, metric, cluster_name, NODE_STATISTIC[metric])
        return f"{found} / {PERIOD_S}" if per_second else found

    def run(metric: str, stat: str = "Average") -> str:
        return search(job.NAMESPACE, job.METRICS[metric][1], metric, cluster_name, stat)

    rows = [
        [
            _metric_widget(
                "GPU utilisation per node (mean of its GPUs)", [nodes(GPU_UTILIZATION)], region, unit="%"
            ),
            _metric_widget(
                "GPU memory used per node (its GPUs)", [nodes(GPU_MEMORY_USED)], region, unit="bytes"
            ),
            _metric_widget("GPU power per node (its GPUs)", [nodes(GPU_POWER_DRAW)], region, unit="W"),
        ],
        [
            _metric_widget(
                "EFA bytes in per node (its devices)",
                [nodes(EFA_RX_BYTES, per_second=True)],
                region,
                unit="bytes/s",
            ),
            _metric_widget(
                "EFA bytes out per node (its devices)",
                [nodes(EFA_TX_BYTES, per_second=True)],
                region,
                unit="bytes/s",
            ),
            _metric_widget(
                "EFA retransmits, impaired connections",
                [nodes(EFA_RETRANSMITTED_PACKETS), nodes(EFA_IMPAIRED_CONNECTIONS)],
                region,
                unit=f"per {PERIOD_S} s",
            ),
        ],
        [
            _metric_widget("Tokens/s per run", [run(job.TOKENS_PER_S)], region, unit="tokens/s"),
            _metric_widget("Loss per run", [run(job.LOSS)], region),
            _metric_widget("MFU per run", [run(job.MFU)], region, unit="fraction of peak"),
        ],
        [
            _metric_widget("Step time per run", [run(job.STEP_TIME_S)], region, unit="s"),
            _metric_widget(
                "EFA bytes/s per node, as the job reads them", [run(job.EFA_METRIC)], region, unit="bytes/s"
            ),
            _metric_widget(
                "Fabric gate: busbw (Gbit/s)", [run(job.BUSBW_METRIC, "Maximum")], region, view="singleValue"
            ),
        ],
        [
            # Each restart publishes once: a period's Sum is the restarts and the steps lost in it.
            _metric_widget(
                "Restarts and steps lost per run",
                [run(job.RESTARTS_METRIC, "Sum"), run(job.LOST_STEPS_METRIC, "Sum")],
                region,
                unit=f"per {PERIOD_S} s",
            ),
        ],
    ]
    header = {
        "type": "text",
        "x": 0,
        "y": 0,
        "width": GRID_COLUMNS,
        "height": HEADER_HEIGHT,
        "properties": {
            "markdown": (
                f"## {cluster_name} ({region})\n"
                f"Per GPU node: Container Insights (`{METRIC_NAMESPACE}`, {ADDON_NAME} {addon_version}), "
                "each node's GPUs or EFA devices together (utilisation their mean). EFA bytes in plus out are "
                "the sysfs tx_bytes and rx_bytes; the job's bytes/s add the RDMA read and write bytes. A node "
                "without a retransmit counter shows 0: `efaCounters` of `pulumi stack output training` names "
                "the counters each worker's node has. "
                f"Per run: the training job's rank 0 and the fabric gate (`{job.NAMESPACE}`); a run is named "
                "after its Ray job, the `jobId` of `pulumi stack output training`."
            )
        },
    }
    widgets = [header]
    for row_index, row in enumerate(rows):
        for column, widget in enumerate(row):
            widget.update(x=column * WIDGET_WIDTH, y=HEADER_HEIGHT + row_index * WIDGET_HEIGHT)
            widgets.append(widget)
    return {"start": "-PT3H", "periodOverride": "inherit", "widgets": widgets}


class Observability(pulumi.ComponentResource):
    """The add-on and its role, the Ray pods' metrics statement, and the dashboard."""

    def __init__(
        self,
        name: str,
        *,
        cluster_name: str,
        eks_cluster_name: pulumi.Input[str],
        region: str,
        addon_version: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        ray_pods_role: aws.iam.Role,
        after: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`eks_cluster_name`: `cluster_name` as an Output of the cluster, so that the add-on goes
        before the control plane on `pulumi destroy`; `after`: the node groups, on which the add-on's
        pods must run before EKS calls it active."""
        super().__init__("eks-ray-train:infra:Observability", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.agent_role = irsa_role(
            f"{name}-agent",
            oidc_provider_arn=oidc_provider_arn,
            oidc_provider_url=oidc_provider_url,
            namespace=AGENT_NAMESPACE,
            service_account=AGENT_SERVICE_ACCOUNT,
            opts=child,
        )
        agent_policy = aws.iam.RolePolicyAttachment(
            f"{name}-agent", role=self.agent_role.name, policy_arn=AGENT_POLICY_ARN, opts=child
        )
        self.addon = aws.eks.Addon(
            ADDON_NAME,
            cluster_name=eks_cluster_name,
            addon_name=ADDON_NAME,
            addon_version=addon_version,
            service_account_role_arn=self.agent_role.arn,
            configuration_values=json.dumps(addon_configuration()),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, agent_policy]),
        )
        self.ray_pods_metrics = aws.iam.RolePolicy(
            f"{name}-ray-pods-metrics", role=ray_pods_role.id, policy=put_metric_data_policy(), opts=child
        )
        self.dashboard = aws.cloudwatch.Dashboard(
            name,
            dashboard_name=dashboard_name(cluster_name, region),
            dashboard_body=json.dumps(dashboard_body(cluster_name, region, addon_version)),
            opts=child,
        )
        self.url = dashboard_url(dashboard_name(cluster_name, region), region)
        # What the training run waits for: the right to publish from its first step. Not the add-on,
        # which comes up beside the Ray side (the Helm releases, the image pulls and the gate take
        # longer): an add-on that fails fails `pulumi up`, but never holds the run and its verdict.
        self.ready: list[pulumi.Resource] = [self.ray_pods_metrics]
        self.register_outputs({"dashboardUrl": self.url, "addonVersion": self.addon.addon_version})
