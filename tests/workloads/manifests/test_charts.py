"""The Helm values against the pinned charts' values.yaml: keys that exist, the EFA plugin's GPU type and registry, the GPU taint, the KubeRay operator namespace-scoped and its pod within `restricted`, and each image by digest once pinned."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from infra.config.stack import StackSettings
from platform_contract import GPU_TOLERATION, image_digest_problem
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


def values_file(chart: manifests.Chart) -> Path:
    """The default values.yaml of exactly the chart version the program deploys."""
    return SCHEMAS / f"{chart.name}-v{chart.version.removeprefix('v')}.values.yaml"


def chart_values(chart: manifests.Chart) -> dict:
    return yaml.safe_load(values_file(chart).read_text())


# A top-level key a values.yaml documents only as a commented-out example (`# watchNamespace:`), as
# charts do for keys without a default; its templates read it all the same.
_COMMENTED_KEY = re.compile(r"^# ([a-z][A-Za-z0-9]*):", re.MULTILINE)


def commented_keys(chart: manifests.Chart) -> set[str]:
    return set(_COMMENTED_KEY.findall(values_file(chart).read_text()))


# Each Helm release's values as the program sets them, with its chart.
RELEASES = [
    (manifests.nvidia_device_plugin_values(), manifests.NVIDIA_DEVICE_PLUGIN),
    (manifests.efa_device_plugin_values("g6.12xlarge", "us-east-2"), manifests.EFA_DEVICE_PLUGIN),
    (manifests.kuberay_operator_values("ray-train"), manifests.KUBERAY_OPERATOR),
]
RELEASE_IDS = ["nvidia", "efa", "kuberay"]


def documented_values(chart: manifests.Chart) -> dict:
    """The chart's defaults, with each commented-out top-level key as a key without a default."""
    return {**dict.fromkeys(commented_keys(chart)), **chart_values(chart)}


@pytest.mark.parametrize("values, chart", RELEASES, ids=RELEASE_IDS)
def test_helm_values_keys_exist_in_the_chart(values, chart):
    """Helm ignores unknown keys silently, so a typo would pass unnoticed anywhere but here."""
    assert _keys_exist(values, documented_values(chart)) == []


def test_the_kuberay_operator_is_namespace_scoped_to_the_ray_namespace():
    """The chart's values.yaml: `singleNamespaceInstall` (default false) makes Roles instead of a
    ClusterRole; `watchNamespace`, a commented-out list there, names where; `crNamespacedRbacEnable`
    (default true) makes the Role in each watched namespace; `rbacEnable` (default true) any RBAC."""
    values = manifests.kuberay_operator_values("ray-train")
    assert values["singleNamespaceInstall"] is True and values["watchNamespace"] == ["ray-train"]
    defaults = chart_values(manifests.KUBERAY_OPERATOR)
    assert defaults["singleNamespaceInstall"] is False
    assert defaults["crNamespacedRbacEnable"] is True and defaults["rbacEnable"] is True
    assert "watchNamespace" not in defaults and "watchNamespace" in commented_keys(manifests.KUBERAY_OPERATOR)
    assert "#   - n1" in values_file(manifests.KUBERAY_OPERATOR).read_text()  # its example is a list


def test_the_kuberay_operators_pod_meets_restricted_pod_security():
    """What the namespace's `restricted` asks of the operator's pod, as the chart's values set it
    (templates/deployment.yaml puts `securityContext` on the one container, `podSecurityContext` on
    the pod, and mounts no volume unless file logging or `configuration` is on)."""
    defaults = chart_values(manifests.KUBERAY_OPERATOR)
    assert defaults["podSecurityContext"] == {}
    assert defaults["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert not (defaults["logging"]["baseDir"] and defaults["logging"]["fileName"])
    assert defaults["configuration"]["enabled"] is False
    values = manifests.kuberay_operator_values("ray-train")
    assert not {"securityContext", "podSecurityContext", "logging", "configuration"} & set(values)


def test_the_values_check_knows_a_commented_key_and_no_prose():
    """A commented key counts; a capitalised word before a colon in a comment (`# Note:`) does not."""
    keys = commented_keys(manifests.KUBERAY_OPERATOR)
    assert {"watchNamespace", "useKubernetesProxy"} <= keys
    assert "Note" not in keys and "Examples" not in keys
    assert _keys_exist({"watchNamespaces": ["n"]}, documented_values(manifests.KUBERAY_OPERATOR)) == [
        "watchNamespaces"
    ]


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


@pytest.mark.parametrize("values, chart", RELEASES, ids=RELEASE_IDS)
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
    assert manifests.kuberay_operator_values("ray-train")["nodeSelector"] == {"role": "system"}


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


DIGEST = "sha256:" + "c" * 64


def chart_image(values: dict) -> str:
    """The image each of the three templates renders: `<image.repository>:<image.tag>`
    (nvidia-device-plugin v0.20.0 templates/_helpers.tpl:85; aws-efa-k8s-device-plugin v0.5.30
    templates/daemonset.yaml:66; kuberay-operator v1.7.0 templates/deployment.yaml:68)."""
    return f"{values['image']['repository']}:{values['image']['tag']}"


def test_the_chart_images_are_the_ones_their_values_name():
    images = manifests.charts.chart_images("us-east-2")
    assert sorted(images.values()) == sorted(chart_image(values) for values, _ in RELEASES)
    assert all(where.endswith("(workloads/manifests/charts.py)") for where in images)
    assert "the image of chart kuberay-operator 1.7.0 (workloads/manifests/charts.py)" in images


def test_pinned_chart_images_render_repository_tag_and_digest_and_unpinned_ones_their_tags():
    """Issue 60: outside dev a release's `image.tag` is `<tag>@sha256:<digest>`, which each template
    renders as `<repository>:<tag>@sha256:<digest>`, an image the runtime pulls by its digest."""
    images = manifests.charts.chart_images("us-west-2")
    pinned = {reference: f"{reference}@{DIGEST}" for reference in images.values()}
    built = [
        manifests.nvidia_device_plugin_values(pinned),
        manifests.efa_device_plugin_values("g6.12xlarge", "us-west-2", pinned),
        manifests.kuberay_operator_values("ray-train", pinned),
    ]
    assert sorted(chart_image(values) for values in built) == sorted(pinned.values())
    assert all(image_digest_problem(chart_image(values)) is None for values in built)
    for (_, chart), pinned_values in zip(RELEASES, built, strict=True):
        assert pinned_values["image"]["tag"] == f"{chart.image_tag}@{DIGEST}"
        assert _keys_exist(pinned_values, documented_values(chart)) == []
    assert manifests.nvidia_device_plugin_values()["image"]["tag"] == "v0.20.0"  # no pins: the tag
