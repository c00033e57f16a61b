"""The observability pieces as pure values: the dashboard's body against CloudWatch's documented
structure, naming only metrics the add-on or the job emits; the add-on's configuration against its
chart's values.yaml; the Ray pods' one statement; the dashboard's name; and in the program's plan the add-on, the Ray
pods' permission and environment, the dashboard and its link, all of it off with `observability`."""

from __future__ import annotations

import json
import re

import jsonschema
import pulumi
import pytest
import yaml

from infra.aws_rules import container_insights
from infra.aws_rules.container_insights import AGENT_POLICY_ARN
from infra.config.stack import CLUSTER_NAME_MAX
from infra.resources.observability import (
    addon_configuration,
    dashboard_body,
    dashboard_name,
    put_metric_data_policy,
)
from platform_contract import GPU_TAINT, GPU_TOLERATION
from tests.harness.fake_aws import OBSERVABILITY_VERSIONS, FakeAws
from tests.harness.fake_cloudwatch import (
    COLLECTION_S,
    EFA_SCRAPE_S,
    FakeAgentNode,
    FakeCloudWatch,
    FakeGpu,
    FakeJobMeter,
)
from tests.harness.fake_efa_sysfs import EFA_COUNTERS_AT_BOOT, EFA_DEVICE, FakeEfaSysfs
from tests.harness.paths import REPO_ROOT
from tests.harness.preview_queries import NODE_GROUP, TRAINING_RUN
from tests.harness.program import ACCOUNT, Preview, dev_config, run_program
from training.metrics import cloudwatch_metrics
from training.metrics.cloudwatch_metrics import CLUSTER_NAME_ENV
from training.metrics.efa_sysfs import counter_lines, parse_counters

CHART_VALUES = REPO_ROOT / "tests/fixtures/schemas/amazon-cloudwatch-observability-6.4.0.values.yaml"
BODY = dashboard_body("eks-ray-train", "us-east-2", "v6.4.0-eksbuild.1")

# CloudWatch API Reference, "Dashboard Body Structure and Syntax": the top level, the widgets array,
# a metric widget's properties, the format of each entry of its `metrics` array (a metric, or one
# math or search expression whose `id` starts with a lowercase letter), its yAxis, and a text widget's.
_STAT = {"type": "string", "pattern": r"^(SampleCount|Average|Sum|Minimum|Maximum|p\d{1,2}(\.\d+)?)$"}
_PERIOD = {"type": "integer", "minimum": 60, "multipleOf": 60}
_AXIS_SIDE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "min": {"type": "number"},
        "max": {"type": "number"},
        "label": {"type": "string"},
        "showUnits": {"type": "boolean"},
    },
}
DASHBOARD_BODY_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["widgets"],
    "additionalProperties": False,
    "properties": {
        "widgets": {"type": "array", "maxItems": 500, "items": {"$ref": "#/$defs/widget"}},
        "variables": {"type": "array", "maxItems": 25},
        "start": {"type": "string", "pattern": r"^-P(T\d+[MH]|\d+[DWM])$"},
        "end": {"type": "string"},
        "periodOverride": {"enum": ["auto", "inherit"]},
    },
    "$defs": {
        "widget": {
            "type": "object",
            "required": ["type", "properties"],
            "additionalProperties": False,
            "dependentRequired": {"x": ["y"], "y": ["x"]},
            "properties": {
                "type": {"enum": ["metric", "text", "log", "alarm", "explorer"]},
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
                "width": {"type": "integer", "minimum": 1, "maximum": 24},
                "height": {"type": "integer", "minimum": 1, "maximum": 1000},
                "properties": {"type": "object"},
            },
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": "metric"}}},
                    "then": {"properties": {"properties": {"$ref": "#/$defs/metricProperties"}}},
                },
                {
                    "if": {"properties": {"type": {"const": "text"}}},
                    "then": {"properties": {"properties": {"$ref": "#/$defs/textProperties"}}},
                },
            ],
        },
        "metricProperties": {
            "type": "object",
            "required": ["region", "metrics"],
            "additionalProperties": False,
            "properties": {
                "accountId": {"type": "string"},
                "annotations": {"type": "object"},
                "liveData": {"type": "boolean"},
                "legend": {
                    "type": "object",
                    "properties": {"position": {"enum": ["right", "bottom", "hidden"]}},
                },
                "metrics": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 500,
                    "items": {"$ref": "#/$defs/metric"},
                },
                "period": _PERIOD,
                "region": {"type": "string"},
                "sparkline": {"type": "boolean"},
                "stacked": {"type": "boolean"},
                "stat": _STAT,
                "table": {"type": "object"},
                "timezone": {"type": "string", "pattern": r"^[+-]\d{4}$"},
                "title": {"type": "string"},
                "view": {"enum": ["timeSeries", "singleValue", "gauge", "bar", "pie", "table"]},
                "yAxis": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"left": _AXIS_SIDE, "right": _AXIS_SIDE},
                },
            },
        },
        "metric": {
            "oneOf": [
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "prefixItems": [
                        {
                            "type": "object",
                            "required": ["expression"],
                            "additionalProperties": False,
                            "properties": {
                                "expression": {"type": "string", "minLength": 1},
                                "id": {"type": "string", "pattern": "^[a-z][A-Za-z0-9_]*$"},
                                "label": {"type": "string"},
                                "period": _PERIOD,
                                "region": {"type": "string"},
                                "stat": _STAT,
                                "visible": {"type": "boolean"},
                                "yAxis": {"enum": ["left", "right"]},
                                "color": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"},
                            },
                        }
                    ],
                },
                {
                    "type": "array",
                    "minItems": 2,
                    "prefixItems": [{"type": "string"}, {"type": "string"}],
                    "items": {"type": ["string", "object"]},
                },
            ]
        },
        "textProperties": {
            "type": "object",
            "required": ["markdown"],
            "additionalProperties": False,
            "properties": {"markdown": {"type": "string"}, "background": {"enum": ["solid", "transparent"]}},
        },
    },
}
VALIDATOR = jsonschema.Draft202012Validator(DASHBOARD_BODY_SCHEMA)

# What `infra.resources.observability.search` writes, read back, with the per-second division of a
# node's changes per collection.
SEARCH = re.compile(
    r"SEARCH\('\{(?P<schema>[^}]+)\} MetricName=\"(?P<metric>[^\"]+)\" ClusterName=\"(?P<cluster>[^\"]+)\"', "
    r"'(?P<stat>\w+)', (?P<period>\d+)\)(?: / (?P<divisor>\d+))?"
)


def test_the_schema_itself_is_valid_and_refuses_what_the_documentation_does():
    jsonschema.Draft202012Validator.check_schema(DASHBOARD_BODY_SCHEMA)
    widget = BODY["widgets"][1]
    for broken in (
        {**widget, "x": 24},
        {**widget, "properties": {**widget["properties"], "view": "line"}},
        {**widget, "properties": {**widget["properties"], "period": 90}},
        {**widget, "properties": {**widget["properties"], "metrics": [[{"expression": "x", "id": "E1"}]]}},
        {
            **widget,
            "properties": {key: value for key, value in widget["properties"].items() if key != "region"},
        },
    ):
        assert not VALIDATOR.is_valid({"widgets": [broken]}), broken


def test_the_body_is_valid_json_of_the_documented_structure():
    VALIDATOR.validate(json.loads(json.dumps(BODY)))


def test_the_widgets_fill_the_grid_without_overlapping():
    cells: set[tuple[int, int]] = set()
    for widget in BODY["widgets"]:
        assert widget["x"] + widget["width"] <= 24
        area = {
            (column, row)
            for column in range(widget["x"], widget["x"] + widget["width"])
            for row in range(widget["y"], widget["y"] + widget["height"])
        }
        assert not area & cells, widget["properties"].get("title")
        cells |= area


def searches(body: dict) -> list[re.Match]:
    found = []
    for widget in body["widgets"]:
        for entry in widget["properties"].get("metrics", []):
            match = SEARCH.fullmatch(entry[0]["expression"])
            assert match, entry
            found.append(match)
    return found


def test_the_dashboard_names_only_metrics_the_add_on_or_the_job_emits_with_their_dimensions():
    emitted = {
        container_insights.METRIC_NAMESPACE: dict.fromkeys(
            container_insights.METRICS, container_insights.NODE_DIMENSIONS
        ),
        cloudwatch_metrics.NAMESPACE: {name: dims for name, (_, dims) in cloudwatch_metrics.METRICS.items()},
    }
    graphed: dict[str, set[str]] = {namespace: set() for namespace in emitted}
    for match in searches(BODY):
        namespace, *dimensions = match["schema"].split(",")
        assert tuple(dimensions) == emitted[namespace][match["metric"]], match[0]
        assert match["cluster"] == "eks-ray-train" and match["period"] == "60"
        assert match["divisor"] in (None, match["period"]), match[0]  # bytes per period -> per second
        graphed[namespace].add(match["metric"])
    # ... and graphs every one of them.
    assert {namespace: set(metrics) for namespace, metrics in emitted.items()} == graphed


def test_the_busbw_is_a_number_and_the_rest_are_graphs():
    views = {
        widget["properties"].get("title"): widget["properties"].get("view") for widget in BODY["widgets"]
    }
    assert [title for title, view in views.items() if view == "singleValue"] == [
        "Fabric gate: busbw (Gbit/s)"
    ]


def _paths(value: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths down to where a value stops being a mapping of the chart's own keys."""
    if not isinstance(value, dict) or prefix[-1:] == ("config",):
        return [prefix]
    return [path for key, child in value.items() for path in _paths(child, (*prefix, key))]


def test_the_add_on_configuration_uses_keys_of_its_chart():
    """The add-on takes its chart's values (CloudWatch user guide, "Configuring the add-on and the
    Helm chart": the same configuration values); `agent.config` is the agent's own JSON."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    for path in _paths(addon_configuration()):
        node = values
        for key in path:
            assert isinstance(node, dict) and key in node, ".".join(path)
            node = node[key]


def test_the_add_on_runs_on_the_tainted_gpu_nodes():
    """Kubernetes' toleration rules: key equal, operator Exists (any value), effect equal."""
    effect = {
        "NO_SCHEDULE": "NoSchedule",
        "NO_EXECUTE": "NoExecute",
        "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    }
    assert any(
        toleration.get("key") == GPU_TAINT["key"]
        and toleration.get("operator") == "Exists"
        and toleration.get("effect") in (None, effect[GPU_TAINT["effect"]])
        for toleration in addon_configuration()["tolerations"]
    )
    kubernetes = addon_configuration()["agent"]["config"]["logs"]["metrics_collected"]["kubernetes"]
    assert kubernetes == {"enhanced_container_insights": True, "accelerated_compute_metrics": True}
    assert addon_configuration()["containerLogs"] == {"enabled": False}


def test_the_ray_pods_may_put_metrics_in_the_jobs_namespace_only():
    (statement,) = json.loads(put_metric_data_policy())["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "cloudwatch:PutMetricData"
    assert statement["Condition"] == {"StringEquals": {"cloudwatch:namespace": cloudwatch_metrics.NAMESPACE}}


def test_the_dashboard_name_holds_for_the_longest_cluster_name():
    """1 to 255 characters of A-Z, a-z, 0-9, "-" and "_" (CloudWatch API Reference, PutDashboard)."""
    name = dashboard_name("c" * CLUSTER_NAME_MAX, "ap-southeast-5")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,255}", name)
    assert dashboard_name("eks-ray-train", "us-east-2") != dashboard_name("eks-ray-train", "us-west-2")


OBSERVABILITY_ADDON = "amazon-cloudwatch-observability"


DASHBOARD = "aws:cloudwatch/dashboard:Dashboard"


ROLE = "aws:iam/role:Role"


ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def ray_pod_envs(plan: Preview) -> list[dict[str, str]]:
    spec = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    return [{e["name"]: e.get("value") for e in t["spec"]["containers"][0]["env"]} for t in templates]


def test_the_add_on_is_pinned_runs_on_every_node_and_has_an_identity_of_its_own(stack_plan):
    config, plan = stack_plan
    region = config["aws:region"]
    addon = plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON)
    assert (
        addon.inputs["addonVersion"]
        == OBSERVABILITY_VERSIONS[plan.one("eks:index:Cluster").inputs["version"]]
    )
    assert json.loads(addon.inputs["configurationValues"]) == addon_configuration()
    assert GPU_TOLERATION in addon_configuration()["tolerations"]
    # After both node groups (its DaemonSets must run before EKS calls it active), and the control plane.
    assert {plan.one(NODE_GROUP, "system").urn, plan.one(NODE_GROUP, "gpu").urn} <= set(addon.dependencies)
    assert plan.one("eks:index:Cluster").urn in addon.dependencies
    # IRSA: the agent's role trusts the cluster's OIDC provider for its service account alone.
    role = plan.one(ROLE, "observability-agent")
    assert addon.inputs["serviceAccountRoleArn"] == f"arn:aws:service:{region}:{ACCOUNT}:role/{role.name}"
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"]["Federated"].endswith(
        f"oidc-provider/oidc.eks.{region}.amazonaws.com/id/0123456789ABCDEF"
    )
    subjects = [v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    assert subjects == ["system:serviceaccount:amazon-cloudwatch:cloudwatch-agent"]
    (attachment,) = [
        r
        for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.inputs["policyArn"] == AGENT_POLICY_ARN
    ]
    assert attachment.inputs["role"] == role.name
    assert plan.ancestors(addon)[0] == "eks-ray-train:infra:Observability"


def test_the_ray_pods_may_publish_to_the_jobs_namespace_and_name_the_cluster(stack_plan):
    config, plan = stack_plan
    cluster = config["eks-ray-train:clusterName"]
    metrics = plan.one(ROLE_POLICY, "observability-ray-pods-metrics")
    assert metrics.inputs["role"] == "checkpoints-ray-pods-id"  # the IRSA role the Ray pods assume
    assert metrics.inputs["policy"] == put_metric_data_policy()
    assert [env.get(CLUSTER_NAME_ENV) for env in ray_pod_envs(plan)] == [cluster, cluster]
    # The run waits for the statement, so its first step is published; never for the add-on.
    run = plan.one(TRAINING_RUN)
    assert metrics.urn in run.dependencies
    assert plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON).urn not in run.dependencies


def test_the_dashboard_and_its_link(stack_plan):
    config, plan = stack_plan
    region, cluster = config["aws:region"], config["eks-ray-train:clusterName"]
    version = plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON).inputs["addonVersion"]
    dashboard = plan.one(DASHBOARD)
    assert dashboard.inputs["dashboardName"] == f"{cluster}-{region}"
    assert json.loads(dashboard.inputs["dashboardBody"]) == dashboard_body(cluster, region, version)
    link = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{cluster}-{region}"
    assert plan.outputs["dashboard"] == link
    assert plan.outputs["training"]["dashboard"] == link


def test_observability_off_creates_none_of_it():
    plan = run_program(dev_config(observability="false"), FakeAws(region="us-east-2"))
    # CoreDNS and the node monitoring agent (`gpuNodeAutoRepair`), no CloudWatch add-on.
    # In any order: the engine registers them as their inputs resolve.
    assert sorted(r.inputs["addonName"] for r in plan.of_type("aws:eks/addon:Addon")) == [
        "coredns",
        "eks-node-monitoring-agent",
    ]
    assert plan.of_type(DASHBOARD) == []
    assert plan.of_type("eks-ray-train:infra:Observability") == []
    assert [r.name for r in plan.of_type(ROLE_POLICY)] == ["checkpoints-ray-pods"]
    assert AGENT_POLICY_ARN not in {
        r.inputs["policyArn"] for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert all(CLUSTER_NAME_ENV not in env for env in ray_pod_envs(plan))
    assert "dashboard" not in plan.outputs
    assert plan.outputs["training"]["dashboard"] is None


def test_an_add_on_version_without_the_dashboards_metrics_stops_the_preview(monkeypatch):
    monkeypatch.setitem(OBSERVABILITY_VERSIONS, "1.36", "v4.10.3-eksbuild.1")
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(), FakeAws(region="us-east-2"))
    message = str(raised.value)
    assert message.startswith(
        "config key 'observability': amazon-cloudwatch-observability v4.10.3-eksbuild.1 predates v5.3.0"
    )
    assert "observability: false" in message and "\n" not in message.strip()
    assert not any(r.type == DASHBOARD for r in raised.value.plan.resources)


# --- what the node widgets read, under an agent modelled on its source ---------------------------------

START = 1_800_000_000.0  # a multiple of 60 s: the graphs' periods begin on it
MINUTES = 10
GIB = 2**30


def widget_expression(title_start: str, index: int = 0) -> str:
    (widget,) = [w for w in BODY["widgets"][1:] if w["properties"]["title"].startswith(title_start)]
    return widget["properties"]["metrics"][index][0]["expression"]


def run_for(seconds: int, agents: list[FakeAgentNode], meters=(), traffic=()) -> None:
    """`seconds` of the nodes' life: the traffic (each `FakeEfaSysfs` with the counts it adds each
    second, written before each read), the EFA scraper every 20 s, the agent's collection every
    minute, a training step every 15 s; each on its own phase, none on a period's boundary."""
    written = 0
    for second in range(seconds):
        now = START + second
        scrape, collect, step = second % EFA_SCRAPE_S == 3, second % COLLECTION_S == 7, second % 15 == 1
        if (scrape or step) and traffic:
            for sysfs, per_second in traffic:
                sysfs.add({name: count * (second - written) for name, count in per_second.items()})
            written = second
        for agent in agents:
            if agent.efa_root is not None and scrape:
                agent.scrape_efa(now)
            if collect:
                agent.collect(now)
        if step:
            for meter in meters:
                meter.step(now)


def steady(values: list[float | None]) -> list[float | None]:
    """The periods after the first: the agent publishes a change per collection from its second on."""
    return values[1:]


def node_series(cloudwatch: FakeCloudWatch, expression: str) -> dict[str, list[float | None]]:
    found = cloudwatch.evaluate(expression, START, START + MINUTES * 60)
    return {dict(dimensions)["NodeName"]: values for dimensions, values in found.items()}


def test_a_nodes_gpu_memory_and_power_read_its_gpus_together_and_utilisation_their_mean():
    """The agent publishes one datapoint per GPU per collection on the node's dimensions: the widgets
    read 4 GPUs of 10 GiB and 70 W as 40 GiB and 280 W (an `Average` would read one GPU's)."""
    cloudwatch = FakeCloudWatch()
    gpus = [FakeGpu(utilization, 10 * GIB, 70.0) for utilization in (40.0, 60.0, 80.0, 100.0)]
    agent = FakeAgentNode(cloudwatch, "eks-ray-train", "node-a", "i-0a1", "g6.12xlarge", gpus)
    run_for(MINUTES * 60, [agent])
    assert node_series(cloudwatch, widget_expression("GPU memory used")) == {"node-a": [40 * GIB] * MINUTES}
    assert node_series(cloudwatch, widget_expression("GPU power")) == {"node-a": [280.0] * MINUTES}
    assert node_series(cloudwatch, widget_expression("GPU utilisation")) == {"node-a": [70.0] * MINUTES}
    per_gpu = widget_expression("GPU memory used").replace("'Sum'", "'Average'")
    assert node_series(cloudwatch, per_gpu) == {"node-a": [10 * GIB] * MINUTES}


def test_efa_bytes_per_node_read_bytes_per_second_over_all_its_devices_as_the_jobs_widget(tmp_path):
    """A node of 4 EFA devices (p4d's count) sending 1 GB/s in all, 0.25 GB/s each, receiving 0.5 GB/s
    and writing 0.1 GB/s by RDMA: the agent publishes each device's change per minute, labelled
    bytes/s; the widgets read 1e9 and 5e8 B/s, and the job's own widget in plus out plus the RDMA
    bytes, which it counts too (`efa_sysfs.MOVED`) and the node widgets do not."""
    cloudwatch = FakeCloudWatch()
    counters = dict.fromkeys(("tx_bytes", "rx_bytes", "rdma_write_bytes"), 0)
    devices = [
        FakeEfaSysfs(tmp_path / "infiniband", device=f"rdmap{index}s27", counters=counters)
        for index in range(4)
    ]
    agent = FakeAgentNode(
        cloudwatch, "eks-ray-train", "node-a", "i-0a1", "p4d.24xlarge", efa_root=tmp_path / "infiniband"
    )
    meter = FakeJobMeter(
        cloudwatch, "eks-ray-train", "02000000", "ray-train-worker-a", tmp_path / "infiniband"
    )
    moving = {"tx_bytes": 250_000_000, "rx_bytes": 125_000_000, "rdma_write_bytes": 25_000_000}
    run_for(MINUTES * 60, [agent], [meter], [(device, moving) for device in devices])
    out_of, into = widget_expression("EFA bytes out"), widget_expression("EFA bytes in")
    assert steady(node_series(cloudwatch, out_of)["node-a"]) == [1e9] * (MINUTES - 1)
    assert steady(node_series(cloudwatch, into)["node-a"]) == [5e8] * (MINUTES - 1)
    job_widget = widget_expression("EFA bytes/s per node, as the job")
    (job_node,) = cloudwatch.evaluate(job_widget, START, START + MINUTES * 60).values()
    assert steady(job_node) == [1e9 + 5e8 + 1e8] * (MINUTES - 1)
    # The agent's numbers before the dashboard's math: each device's bytes per minute.
    one_device = out_of.replace("'Sum'", "'Average'").removesuffix(f" / {COLLECTION_S}")
    assert steady(node_series(cloudwatch, one_device)["node-a"]) == [60 * 250_000_000] * (MINUTES - 1)


def test_a_node_without_a_retransmit_counter_reads_0_and_the_run_names_the_counters_it_has(tmp_path):
    """The agent reads a missing counter file as 0, so the widget cannot tell the node without
    `retrans_pkts` from the node without retransmits; the counters the TrainingRun reads (its
    `efa_counters` output, per worker pod) name only the files the node has."""
    cloudwatch = FakeCloudWatch()
    with_counter = FakeEfaSysfs(tmp_path / "a" / "infiniband")
    without = FakeEfaSysfs(
        tmp_path / "b" / "infiniband",
        counters={name: value for name, value in EFA_COUNTERS_AT_BOOT.items() if name != "retrans_pkts"},
    )
    agents = [
        FakeAgentNode(cloudwatch, "eks-ray-train", name, f"i-0{name}", "g6.12xlarge", efa_root=sysfs.root)
        for name, sysfs in (("node-a", with_counter), ("node-b", without))
    ]
    run_for(MINUTES * 60, agents)
    read = node_series(cloudwatch, widget_expression("EFA retransmits"))
    assert {node: steady(values) for node, values in read.items()} == {
        "node-a": [0] * (MINUTES - 1),
        "node-b": [0] * (MINUTES - 1),
    }
    has = {name: set(counters) for name, counters in parse_counters(counter_lines(str(without.root))).items()}
    assert "retrans_pkts" not in has[f"{EFA_DEVICE}/1"] and "tx_bytes" in has[f"{EFA_DEVICE}/1"]
    assert "retrans_pkts" in parse_counters(counter_lines(str(with_counter.root)))[f"{EFA_DEVICE}/1"]


def test_the_fake_evaluates_every_expression_of_the_dashboard_and_refuses_any_other():
    cloudwatch = FakeCloudWatch()
    for widget in BODY["widgets"][1:]:
        for entry in widget["properties"]["metrics"]:
            assert cloudwatch.evaluate(entry[0]["expression"], START, START + 60) == {}
    with pytest.raises(NotImplementedError):
        cloudwatch.evaluate("SUM(SEARCH('{ContainerInsights,NodeName} tx', 'Sum', 60))", START, START + 60)


def test_restarts_and_lost_steps_read_per_run_what_its_restarts_published():
    """The job publishes, once per restart, 1 as `restarts` and the attempt's `lost_steps`
    (`training.metrics.cloudwatch_metrics`, on the run's dimensions): the widget's `Sum` per period
    reads how many restarts and how many lost steps fell in it, each run its own line."""
    cloudwatch = FakeCloudWatch()
    restarts = [("run-a", 90.0, 4), ("run-a", 110.0, 7), ("run-a", 330.0, 2), ("run-b", 200.0, 5)]
    for run, at, lost in restarts:
        dimensions = {
            cloudwatch_metrics.CLUSTER_DIMENSION: "eks-ray-train",
            cloudwatch_metrics.RUN_DIMENSION: run,
        }
        cloudwatch.put(
            cloudwatch_metrics.NAMESPACE, cloudwatch_metrics.RESTARTS_METRIC, dimensions, START + at, 1
        )
        cloudwatch.put(
            cloudwatch_metrics.NAMESPACE, cloudwatch_metrics.LOST_STEPS_METRIC, dimensions, START + at, lost
        )

    def per_run(index: int) -> dict[str, list[float | None]]:
        found = cloudwatch.evaluate(
            widget_expression("Restarts and steps lost", index), START, START + 6 * 60
        )
        return {
            dict(dimensions)[cloudwatch_metrics.RUN_DIMENSION]: values for dimensions, values in found.items()
        }

    assert per_run(0) == {
        "run-a": [None, 2, None, None, None, 1],
        "run-b": [None, None, None, 1, None, None],
    }
    assert per_run(1) == {
        "run-a": [None, 11, None, None, None, 2],
        "run-b": [None, None, None, 5, None, None],
    }
