"""Every Kubernetes object and Helm value we build, checked against the real schemas."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.aws_facts.sizing import WorkerSizing
from infra.config.stack import StackSettings
from platform_facts import RAY_PORTS
from tests.harness.paths import FIXTURES, REPO_ROOT
from workloads import efa_counter_reader, manifests
from workloads.training_run.verdicts import evidence

ROOT = REPO_ROOT
SCHEMAS = FIXTURES / "schemas"
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
    from infra.config.stack import DEFAULT_IMAGE

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


def vendored_crd(file_name: str) -> dict:
    return yaml.load(
        (manifests.KUBERAY_CRD_DIR / file_name).read_text(),
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )


@pytest.fixture(scope="module")
def ray_cluster_schema() -> dict:
    crd = vendored_crd("ray.io_rayclusters.yaml")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return closed(version["schema"]["openAPIV3Schema"])


# Git blob ids of `helm-chart/kuberay-operator/crds/*` at kuberay tag v1.7.0 (commit 59d663ae),
# the chart's whole `crds/` folder (`git ls-tree v1.7.0 helm-chart/kuberay-operator/crds`).
KUBERAY_CRD_BLOBS = {
    "ray.io_rayclusters.yaml": "ff0be58ada3bd457605eff1f258c16df21e61e21",
    "ray.io_raycronjobs.yaml": "bc8375d655b433333d8be5848e9caf28e0576b7b",
    "ray.io_rayjobs.yaml": "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0",
    "ray.io_rayservices.yaml": "7ee63d6ddd11237a5649e04b3a8db3c52074c867",
}


def git_blob_id(path: Path) -> str:
    content = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def test_vendored_crds_are_the_pinned_charts_unchanged():
    """Every CRD of the chart's `crds/`, byte for byte; the folder is named after the pinned chart."""
    assert manifests.KUBERAY_CRD_DIR.name == f"kuberay-v{manifests.KUBERAY_OPERATOR.version}"
    assert manifests.KUBERAY_OPERATOR.version == "1.7.0", "re-vendor the CRDs and their blob ids"
    assert sorted(path.name for path in manifests.KUBERAY_CRD_DIR.iterdir()) == sorted(KUBERAY_CRD_BLOBS)
    assert set(manifests.KUBERAY_CRD_FILES) == set(KUBERAY_CRD_BLOBS)
    for name, blob in KUBERAY_CRD_BLOBS.items():
        assert git_blob_id(manifests.KUBERAY_CRD_DIR / name) == blob, name


def test_crds_are_applied_forced_and_as_upstream_wrote_them():
    crds = manifests.kuberay_crds()
    assert [crd["metadata"]["name"] for crd in crds] == [
        "rayclusters.ray.io",
        "raycronjobs.ray.io",
        "rayjobs.ray.io",
        "rayservices.ray.io",
    ]
    for crd, file_name in zip(crds, manifests.KUBERAY_CRD_FILES, strict=True):
        assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        assert crd["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION] == "true"
        upstream = vendored_crd(file_name)
        del crd["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION]
        assert crd == upstream
    # Each call is a fresh copy: the program's edits never reach the cached text.
    assert manifests.kuberay_crds()[0]["metadata"]["annotations"][manifests.PATCH_FORCE_ANNOTATION] == "true"


def test_the_raycluster_crd_is_too_large_for_a_client_side_apply():
    """kubectl's and pulumi-kubernetes's client-side apply keep the whole object in the
    `last-applied-configuration` annotation, and the API server refuses annotations over 256 KiB
    (apimachinery `TotalAnnotationSizeLimitB`): only server-side apply can apply this CRD."""
    crd = manifests.kuberay_crds()[0]
    assert len(json.dumps(crd, separators=(",", ":"))) > 256 * 1024


def test_ray_cluster_recreates_its_pods_on_a_spec_change(ray_cluster_schema):
    """kuberay v1.7.0 `raycluster_types.go`: `upgradeStrategy.type` is Recreate or None (unset: None)."""
    cluster = manifests.ray_cluster(spec())
    assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    allowed = ray_cluster_schema["properties"]["spec"]["properties"]["upgradeStrategy"]["properties"]["type"]
    assert "Recreate" in allowed["enum"]


def templates(cluster: dict) -> list[dict]:
    return [
        cluster["spec"]["headGroupSpec"]["template"],
        *(group["template"] for group in cluster["spec"]["workerGroupSpecs"]),
    ]


def test_both_pod_templates_carry_the_spec_hash():
    cluster = manifests.ray_cluster(spec())
    stamped = [template["metadata"]["annotations"] for template in templates(cluster)]
    assert len(stamped) == 2
    assert all(
        annotations == {manifests.SPEC_HASH_ANNOTATION: manifests.spec_hash(cluster)}
        for annotations in stamped
    )
    # The hash is of the spec without the annotations, so stamping it does not change it.
    bare = copy.deepcopy(cluster)
    for template in templates(bare):
        del template["metadata"]
    assert manifests.spec_hash(bare) == manifests.spec_hash(cluster)


@pytest.mark.parametrize(
    "change",
    [
        {"image": "rayproject/ray:2.58.0-py311-gpu"},
        {"region": "us-west-2"},
        {"worker_replicas": 3},
        {"head_memory": "16Gi"},
        {"code_files": {**CODE, "training/new.py": ""}},
    ],
    ids=["image", "environment", "replicas", "resources", "code-file-list"],
)
def test_spec_hash_follows_what_the_pods_run(change):
    """A new code file changes the volume's items, which only a new pod mounts: the pods must be recreated."""
    before, after = manifests.ray_cluster(spec()), manifests.ray_cluster(spec(**change))
    assert manifests.spec_hash(after) != manifests.spec_hash(before)
    assert templates(after)[0]["metadata"] != templates(before)[0]["metadata"]


def test_new_code_in_the_same_files_keeps_the_pods():
    """The kubelet updates a ConfigMap volume in place; the training run waits for `.code-hash`."""
    changed = {**CODE, "training/loop.py": "print('bye')\n"}
    assert manifests.spec_hash(manifests.ray_cluster(spec(code_files=changed))) == manifests.spec_hash(
        manifests.ray_cluster(spec())
    )


def test_ray_session_folder_is_an_empty_dir_on_every_pod():
    """AWS's Ray sample mounts an emptyDir at /tmp/ray: Ray's logs, the transport evidence, outlive a
    container restart, and object spill stays off the overlay filesystem."""
    for template in templates(manifests.ray_cluster(spec())):
        pod = template["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == manifests.RAY_LOGS_VOLUME)
        assert volume == {"name": "ray-logs", "emptyDir": {}}
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": "ray-logs", "mountPath": "/tmp/ray"} in mounts
    assert evidence.RAY_LOG_DIR.startswith(manifests.RAY_TMP_DIR + "/")


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
        "NODE_IP": None,  # from the downward API
        "TRAINING_EFA_COUNTERS_URL": "http://$(NODE_IP):9478/",
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
        manifests.head_network_policy("ray-train", "ray-train"),
        efa_counter_reader.reader_namespace(),
        efa_counter_reader.reader_daemonset("763104351884.dkr.ecr.us-east-2.amazonaws.com/ray:2.58.0-gpu"),
    ],
    ids=lambda m: f"{m['kind']}-{m['metadata']['name']}",
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
    assert manifests.GPU_TOLERATION in manifests.nvidia_device_plugin_values()["tolerations"]
    efa = manifests.efa_device_plugin_values("g6.12xlarge", "us-east-2")
    assert manifests.GPU_TOLERATION in efa["tolerations"]
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


def test_hf_token_reaches_every_ray_pod_from_the_secret():
    cluster = manifests.ray_cluster(spec())
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["spec"]["workerGroupSpecs"]]
    for template in templates:
        env = {item["name"]: item for item in template["spec"]["containers"][0]["env"]}
        reference = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == manifests.HF_TOKEN_SECRET and reference["optional"] is True


# --- network policy and pod security ----------------------------------------------------------


def admits(policy: dict, policy_namespace: str, pod_labels: dict, source_namespace: str, port: int) -> bool:
    """Whether a NetworkPolicy lets a pod of `source_namespace` open `port` on a pod with `pod_labels`.

    Models the Kubernetes NetworkPolicy rules for ingress (networking.k8s.io/v1), as far as this
    program's policy uses them: a pod the policy selects is isolated for ingress, and a connection is
    admitted when one rule's `from` peers (missing: anyone) and `ports` (missing: all) both match; a
    peer with a `podSelector` and no `namespaceSelector` matches pods of the policy's own namespace.
    """
    selected = policy["spec"]["podSelector"].get("matchLabels", {}).items() <= pod_labels.items()
    if not selected or "Ingress" not in policy["spec"]["policyTypes"]:
        return True
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        from_ok = peers is None or any(
            "namespaceSelector" not in peer and source_namespace == policy_namespace for peer in peers
        )
        ports = rule.get("ports")
        port_ok = ports is None or any(p.get("port") == port for p in ports)
        if from_ok and port_ok:
            return True
    return False


def test_ray_head_ports_are_closed_to_other_namespaces():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    head = manifests.head_pod_labels("ray-train")
    assert manifests.head_pod_selector("ray-train") == "ray.io/cluster=ray-train,ray.io/node-type=head"
    for port in RAY_PORTS.values():
        assert not admits(policy, "ray-train", head, "default", port)
        assert not admits(policy, "ray-train", head, manifests.KUBERAY_OPERATOR.namespace, port)
        assert admits(policy, "ray-train", head, "ray-train", port)
    # Workers reach the head on Ray's other ports too (object manager, raylet, worker ports).
    assert admits(policy, "ray-train", head, "ray-train", 12345)
    # Workers are not selected: the policy leaves them as they were.
    worker = {manifests.RAY_CLUSTER_LABEL: "ray-train", manifests.RAY_NODE_TYPE_LABEL: "worker"}
    assert admits(policy, "ray-train", worker, "default", RAY_PORTS["dashboard"])


def test_policy_model_catches_an_open_rule():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    policy["spec"]["ingress"] = [{}]
    assert admits(policy, "ray-train", manifests.head_pod_labels("ray-train"), "default", 8265)


def test_network_policy_schema_check_catches_a_bad_field():
    policy = manifests.head_network_policy("ray-train", "ray-train")
    policy["spec"]["podSelectors"] = policy["spec"].pop("podSelector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)


def test_ray_namespace_enforces_baseline_and_reports_restricted():
    labels = manifests.namespace("ray-train")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert (
        labels["pod-security.kubernetes.io/warn"]
        == labels["pod-security.kubernetes.io/audit"]
        == "restricted"
    )
    assert labels["app.kubernetes.io/part-of"] == "eks-ray-train"


def ray_pod_specs() -> list[dict]:
    cluster = manifests.ray_cluster(spec())
    templates = [cluster["spec"]["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["spec"]["workerGroupSpecs"]]
    return [template["spec"] for template in templates]


def baseline_problems(pod: dict) -> list[str]:
    """Controls of the Pod Security Standards' `baseline` profile a pod spec fails (the ones a pod spec
    like ours could touch: host namespaces and paths, privilege, added capabilities beyond the
    runtime's defaults, an unconfined seccomp profile)."""
    allowed_adds = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD"}
    allowed_adds |= {"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
    problems = [f"{key} set" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    problems += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") == "Unconfined":
        problems.append("pod seccomp Unconfined")
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{container['name']} privileged")
        problems += [
            f"{container['name']} adds {cap}"
            for cap in context.get("capabilities", {}).get("add", [])
            if cap not in allowed_adds
        ]
        problems += [f"{container['name']} hostPort" for p in container.get("ports", []) if p.get("hostPort")]
    return problems


def restricted_gaps(pod: dict) -> list[str]:
    """What `restricted` asks beyond `baseline` that a pod spec lacks."""
    gaps = []
    if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
        gaps.append("seccompProfile")
    for container in pod["containers"]:
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            gaps.append("allowPrivilegeEscalation")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            gaps.append("drop ALL")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            gaps.append("capabilities added")
        if not (context.get("runAsNonRoot") or pod.get("securityContext", {}).get("runAsNonRoot")):
            gaps.append("runAsNonRoot")
    return gaps


def test_ray_pods_meet_baseline_and_miss_restricted_only_by_running_as_root():
    for pod in ray_pod_specs():
        assert baseline_problems(pod) == []
        assert set(restricted_gaps(pod)) == {"runAsNonRoot"}


def test_pod_security_checks_catch_a_privileged_container():
    pod = ray_pod_specs()[1]
    pod["containers"][0]["securityContext"] = {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}}
    assert baseline_problems(pod) == ["ray-worker privileged", "ray-worker adds IPC_LOCK"]
    assert "drop ALL" in restricted_gaps(pod)
