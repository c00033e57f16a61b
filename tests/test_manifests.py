"""Every Kubernetes object and Helm value we build, checked against the real schemas."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.config import StackSettings
from infra.sizing import WorkerSizing
from workloads import manifests

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = Path(__file__).resolve().parent / "fixtures" / "schemas"
KUBERNETES_VERSION = "1.36.0"
WORKER = WorkerSizing(
    gpus=4,
    efa_interfaces=1,
    cpu=40,
    memory="160Gi",
    node_allocatable_cpu_millis=46_000,
    node_allocatable_memory_mib=190_000,
)
CODE = {"training/__init__.py": "", "training/loop.py": "print('hi')\n", "training/configs/tiny.json": "{}"}


def spec(**overrides) -> manifests.RayClusterSpec:
    fields = {
        "name": "ray-train",
        "namespace": "ray-train",
        "image": manifests_image(),
        "ray_version": "2.58.0",
        "region": "us-east-2",
        "worker_replicas": 2,
        "worker": WORKER,
        "service_account": "ray-train",
        "code_configmap": "training-code",
        "code_files": CODE,
    }
    return manifests.RayClusterSpec(**{**fields, **overrides})


def manifests_image() -> str:
    from infra.config import DEFAULT_IMAGE

    return DEFAULT_IMAGE


def closed(schema: dict) -> dict:
    """The CRD schema with unknown fields forbidden.

    The API server silently prunes fields a structural schema does not know, so a misspelt key
    would vanish instead of failing; closing every object schema turns that into an error here.
    """
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@pytest.fixture(scope="module")
def ray_cluster_schema() -> dict:
    crd = yaml.safe_load(
        (SCHEMAS / f"kuberay-v{manifests.KUBERAY_OPERATOR.version}-ray.io_rayclusters.yaml").read_text()
    )
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return closed(version["schema"]["openAPIV3Schema"])


def test_ray_cluster_matches_the_kuberay_crd(ray_cluster_schema):
    jsonschema.validate(manifests.ray_cluster(spec()), ray_cluster_schema)


def test_crd_check_catches_a_misspelt_field(ray_cluster_schema):
    broken = manifests.ray_cluster(spec())
    broken["spec"]["headGroupSpec"]["rayStartParam"] = broken["spec"]["headGroupSpec"].pop("rayStartParams")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, ray_cluster_schema)


def test_worker_pods_match_the_reference_sizes():
    worker_group = manifests.ray_cluster(spec())["spec"]["workerGroupSpecs"][0]
    container = worker_group["template"]["spec"]["containers"][0]
    expected = {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}
    assert container["resources"]["requests"] == expected
    assert container["resources"]["limits"] == expected
    assert worker_group["rayStartParams"]["num-gpus"] == container["resources"]["limits"]["nvidia.com/gpu"]
    assert worker_group["replicas"] == worker_group["minReplicas"] == worker_group["maxReplicas"] == 2
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env == {
        "FI_PROVIDER": "efa",
        "NCCL_NET_PLUGIN": "ofi",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_DEBUG": "INFO",
        "AWS_REGION": "us-east-2",
        "AWS_DEFAULT_REGION": "us-east-2",
        "HF_TOKEN": None,
    }
    pod = worker_group["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-worker"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_gpu_count_follows_the_instance_type():
    bigger = WorkerSizing(
        gpus=8,
        efa_interfaces=32,
        cpu=100,
        memory="1000Gi",
        node_allocatable_cpu_millis=190_000,
        node_allocatable_memory_mib=2_000_000,
    )
    worker_group = manifests.ray_cluster(spec(worker=bigger))["spec"]["workerGroupSpecs"][0]
    limits = worker_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert worker_group["rayStartParams"]["num-gpus"] == limits["nvidia.com/gpu"] == "8"
    assert limits["vpc.amazonaws.com/efa"] == "32"


def test_head_has_no_gpu_and_no_external_service():
    head = manifests.ray_cluster(spec())["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-gpus": "0"}
    container = head["template"]["spec"]["containers"][0]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    # Pods cannot ask the instance metadata service (hop limit 1): the region comes in the environment.
    assert {"name": "AWS_REGION", "value": "us-east-2"} in container["env"]
    assert sorted(p["containerPort"] for p in container["ports"]) == [6379, 8265, 10001]
    assert head["template"]["spec"]["nodeSelector"] == {"role": "system"}
    assert "nvidia.com/gpu" not in container["resources"]["requests"]


@pytest.mark.parametrize(
    "manifest",
    [
        manifests.namespace("ray-train"),
        manifests.service_account("ray-train", "ray-train", "arn:aws:iam::123456789012:role/ray"),
        manifests.training_code_configmap("training-code", "ray-train", CODE),
        manifests.hf_token_secret("ray-train", "hf_example"),
    ],
    ids=lambda m: m["kind"],
)
def test_core_objects_match_kubernetes_schemas(manifest):
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_pod_templates_match_kubernetes_schemas():
    """The head and worker pod templates are core PodSpecs: validate them as Pods, strictly."""
    cluster = manifests.ray_cluster(spec())
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["spec"]["workerGroupSpecs"]]
    for template in templates:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": template["spec"]}
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_schema_check_catches_a_bad_pod_field():
    template = manifests.ray_cluster(spec())["spec"]["workerGroupSpecs"][0]["template"]
    template["spec"]["tolerationz"] = template["spec"].pop("tolerations")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": template["spec"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_shipped_code_volume_restores_every_path():
    volume = manifests.code_volume("training-code", CODE)
    paths = {item["path"] for item in volume["configMap"]["items"]}
    assert paths == {*CODE, manifests.CODE_HASH_FILE}
    configmap = manifests.training_code_configmap("training-code", "ray-train", CODE)
    assert {item["key"] for item in volume["configMap"]["items"]} == set(configmap["data"])
    assert configmap["data"][manifests.CODE_HASH_FILE.replace("/", "__")] == manifests.code_hash(CODE)


def test_code_hash_changes_with_the_code():
    changed = {**CODE, "training/loop.py": "print('bye')\n"}
    assert manifests.code_hash(changed) != manifests.code_hash(CODE)
    assert manifests.code_hash(dict(reversed(CODE.items()))) == manifests.code_hash(CODE)


def test_real_training_package_fits_a_configmap():
    files = manifests.collect_code(ROOT)
    assert "training/__init__.py" in files
    manifests.training_code_configmap("training-code", "ray-train", files)


def test_oversized_code_is_refused():
    with pytest.raises(ValueError, match="ConfigMap holds at most"):
        manifests.training_code_configmap("c", "n", {"training/big.txt": "x" * 1_100_000})


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
        (manifests.efa_device_plugin_values(), manifests.EFA_DEVICE_PLUGIN),
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


def test_device_plugins_tolerate_the_gpu_taint_and_mofed_is_off():
    assert manifests.nvidia_device_plugin_values()["mofedEnabled"] is False
    assert manifests.GPU_TOLERATION in manifests.nvidia_device_plugin_values()["tolerations"]
    efa = manifests.efa_device_plugin_values()
    assert manifests.GPU_TOLERATION in efa["tolerations"]
    assert efa["nodeSelector"] == {"role": "gpu-worker"}
    assert manifests.kuberay_operator_values()["nodeSelector"] == {"role": "system"}


def test_efa_chart_version_lists_g6():
    """Chart versions up to v0.5.4 do not list g6.12xlarge and never schedule there."""
    major, minor, patch = (int(part) for part in manifests.EFA_DEVICE_PLUGIN.version.lstrip("v").split("."))
    assert (major, minor, patch) > (0, 5, 4)


def test_hf_token_reaches_every_ray_pod_from_the_secret():
    cluster = manifests.ray_cluster(spec())
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["spec"]["workerGroupSpecs"]]
    for template in templates:
        env = {item["name"]: item for item in template["spec"]["containers"][0]["env"]}
        reference = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == manifests.HF_TOKEN_SECRET and reference["optional"] is True
