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

from infra.aws_facts import container_insights
from infra.aws_facts.container_insights import AGENT_POLICY_ARN
from infra.config.stack import CLUSTER_NAME_MAX
from infra.resources.observability import (
    addon_configuration,
    dashboard_body,
    dashboard_name,
    put_metric_data_policy,
)
from platform_contract import GPU_TAINT, GPU_TOLERATION
from tests.harness.fake_aws import OBSERVABILITY_VERSIONS, FakeAws
from tests.harness.paths import REPO_ROOT
from tests.harness.preview_queries import NODE_GROUP, TRAINING_RUN
from tests.harness.program import ACCOUNT, Preview, dev_config, run_program
from training.metrics import cloudwatch_metrics
from training.metrics.cloudwatch_metrics import CLUSTER_NAME_ENV

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

# What `infra.resources.observability.search` writes, read back.
SEARCH = re.compile(
    r"SEARCH\('\{(?P<schema>[^}]+)\} MetricName=\"(?P<metric>[^\"]+)\" ClusterName=\"(?P<cluster>[^\"]+)\"', "
    r"'(?P<stat>\w+)', (?P<period>\d+)\)"
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
    assert [r.inputs["addonName"] for r in plan.of_type("aws:eks/addon:Addon")] == ["coredns"]
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
