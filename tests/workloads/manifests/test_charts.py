"""The Helm values against the pinned charts' values.yaml: keys that exist, the EFA plugin's GPU type and registry, the GPU taint."""

from __future__ import annotations

import copy

import pytest
import yaml

from infra.config.stack import StackSettings
from platform_contract import GPU_TOLERATION
from tests.harness.paths import FIXTURES
from workloads import manifests

SCHEMAS = FIXTURES / "schemas"


def _keys_exist(values: dict, reference: dict, path: str = "") -> list[str]:
    """Paths of keys in `values` that the chart's values.yaml does not define."""
    missing = []
    for key, value in values.items():
        where = f"{path}.{key}" if path else key
        if not isinstance(reference, dict) or key not in reference:
            missing.append(where)
        elif isinstance(value, dict) and isinstance(reference[key], dict) and reference[key]:
            missing.extend(_keys_exist(value, reference[key], where))
    return missing


def chart_values(chart: manifests.Chart) -> dict:
    """The default values.yaml of exactly the chart version the program deploys."""
    return yaml.safe_load(
        (SCHEMAS / f"{chart.name}-v{chart.version.removeprefix('v')}.values.yaml").read_text()
    )


@pytest.mark.parametrize(
    "values, chart",
    [
        (manifests.nvidia_device_plugin_values(), manifests.NVIDIA_DEVICE_PLUGIN),
        (manifests.efa_device_plugin_values("g6.12xlarge", "us-east-2"), manifests.EFA_DEVICE_PLUGIN),
        (manifests.kuberay_operator_values(), manifests.KUBERAY_OPERATOR),
    ],
    ids=["nvidia", "efa", "kuberay"],
)
def test_helm_values_keys_exist_in_the_chart(values, chart):
    """Helm ignores unknown keys silently, so a typo would pass unnoticed anywhere but here."""
    assert _keys_exist(values, chart_values(chart)) == []


def test_values_check_catches_a_typo():
    reference = chart_values(manifests.NVIDIA_DEVICE_PLUGIN)
    assert _keys_exist({"mofedEnable": False}, reference) == ["mofedEnable"]


def test_efa_device_plugin_chart_schedules_on_the_gpu_type():
    """The chart's node affinity allowlists instance types; a type missing there gets no EFA device."""
    supported = chart_values(manifests.EFA_DEVICE_PLUGIN)["supportedInstanceLabels"]["values"]
    assert StackSettings(region="us-east-2").gpu_node_type in supported


# The image each chart runs when its values name none: values.yaml's `image.tag`, else the template's
# default, `v<appVersion>` for the NVIDIA chart (templates/_helpers.tpl `fullimage`; Chart.yaml of
# v0.20.0 has appVersion 0.20.0). The EFA chart's repository is the region's (tested below).
CHART_DEFAULT_TAGS = {
    manifests.NVIDIA_DEVICE_PLUGIN.name: "v0.20.0",
    manifests.EFA_DEVICE_PLUGIN.name: "v0.5.20",
    manifests.KUBERAY_OPERATOR.name: "v1.7.0",
}


@pytest.mark.parametrize(
    "values, chart",
    [
        (manifests.nvidia_device_plugin_values(), manifests.NVIDIA_DEVICE_PLUGIN),
        (manifests.efa_device_plugin_values("g6.12xlarge", "us-east-2"), manifests.EFA_DEVICE_PLUGIN),
        (manifests.kuberay_operator_values(), manifests.KUBERAY_OPERATOR),
    ],
    ids=["nvidia", "efa", "kuberay"],
)
def test_each_release_names_its_image_tag_the_charts_own(values, chart):
    """The values name the image a release runs, tag and repository, rather than leave it to the chart;
    they are the chart's own at the pinned version, so a chart bump fails here until they are checked."""
    defaults = chart_values(chart)["image"]
    assert values["image"]["tag"] == chart.image_tag == (defaults["tag"] or CHART_DEFAULT_TAGS[chart.name])
    assert chart.image_tag == CHART_DEFAULT_TAGS[chart.name]
    if chart is not manifests.EFA_DEVICE_PLUGIN:
        assert values["image"]["repository"] == defaults["repository"]


@pytest.mark.parametrize(
    "region, repository",
    [
        ("us-east-2", "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/aws-efa-k8s-device-plugin"),
        ("af-south-1", "877085696533.dkr.ecr.af-south-1.amazonaws.com/eks/aws-efa-k8s-device-plugin"),
        ("cn-north-1", "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn/eks/aws-efa-k8s-device-plugin"),
    ],
)
def test_the_efa_plugin_image_comes_from_the_stack_regions_eks_registry(region, repository):
    """The chart's default is us-west-2's registry: a cross-region pull through the NAT elsewhere.
    Registries from the EKS user guide, "View Amazon container image registries for Amazon EKS add-ons"."""
    default = chart_values(manifests.EFA_DEVICE_PLUGIN)["image"]["repository"]
    assert default.startswith("602401143452.dkr.ecr.us-west-2.amazonaws.com/")
    values = manifests.efa_device_plugin_values("g6.12xlarge", region)
    assert values["image"]["repository"] == repository
    assert repository.endswith(default.split("/", 1)[1])  # the same repository, the region's registry


def test_device_plugins_tolerate_the_gpu_taint_and_mofed_is_off():
    assert manifests.nvidia_device_plugin_values()["mofedEnabled"] is False
    assert GPU_TOLERATION in manifests.nvidia_device_plugin_values()["tolerations"]
    efa = manifests.efa_device_plugin_values("g6.12xlarge", "us-east-2")
    assert GPU_TOLERATION in efa["tolerations"]
    assert efa["nodeSelector"] == {"role": "gpu-worker"}
    assert manifests.kuberay_operator_values()["nodeSelector"] == {"role": "system"}


def helm_merged(defaults: dict, values: dict) -> dict:
    """Helm's coalescing of user values over a chart's defaults: maps merge key by key, anything else
    (lists included) replaces the default (helm `pkg/chartutil/coalesce.go`)."""
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merged(merged[key], value)
        else:
            merged[key] = value
    return merged


# g6e.4xlarge: a type the pinned chart does not list (its DaemonSet would never schedule there).
@pytest.mark.parametrize("gpu_type, chart_lists_it", [("g6.12xlarge", True), ("g6e.4xlarge", False)])
def test_efa_device_plugin_schedules_only_on_the_configured_gpu_type(gpu_type, chart_lists_it):
    """The chart's DaemonSet (templates/daemonset.yaml) requires, for each of
    `supportedInstanceLabels.keys`, a node label value In `supportedInstanceLabels.values`."""
    defaults = chart_values(manifests.EFA_DEVICE_PLUGIN)
    assert (gpu_type in defaults["supportedInstanceLabels"]["values"]) is chart_lists_it
    merged = helm_merged(defaults, manifests.efa_device_plugin_values(gpu_type, "us-east-2"))[
        "supportedInstanceLabels"
    ]
    assert merged["keys"] == defaults["supportedInstanceLabels"]["keys"] == [manifests.INSTANCE_TYPE_LABEL]
    assert merged["values"] == [gpu_type]


def test_efa_chart_version_lists_g6():
    """Chart versions up to v0.5.4 do not list g6.12xlarge and never schedule there."""
    major, minor, patch = (int(part) for part in manifests.EFA_DEVICE_PLUGIN.version.lstrip("v").split("."))
    assert (major, minor, patch) > (0, 5, 4)
