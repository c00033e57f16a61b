"""The RayCluster against the KubeRay CRD and Kubernetes schemas: its spec hash, sizes, pods, token and pod security."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
from kubernetes.utils import parse_quantity

from infra.aws_rules.sizing import WorkerSizing
from tests.harness.manifest_checks import CODE, KUBERNETES_VERSION, vendored_crd
from training.config.drain_budget import DEFAULT_GRACE_S, RAY_STOP_MARGIN_S
from workloads import manifests
from workloads.manifests import raycluster
from workloads.training_run.verdicts import evidence

WORKER = WorkerSizing(
    gpus=4,
    efa_interfaces=1,
    cpu=40,
    memory="160Gi",
    node_allocatable_cpu_millis=46_000,
    node_allocatable_memory_mib=190_000,
)


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


@pytest.fixture(scope="module")
def ray_cluster_schema() -> dict:
    crd = vendored_crd("ray.io_rayclusters.yaml")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return closed(version["schema"]["openAPIV3Schema"])


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
    hashed = {manifests.SPEC_HASH_ANNOTATION: manifests.spec_hash(cluster)}
    # The head's also keeps a cluster autoscaler off its node (test_head_disruption_budget.py).
    assert stamped == [{**hashed, manifests.SAFE_TO_EVICT_ANNOTATION: "false"}, hashed]
    # The hash is of the spec without its own annotation, so stamping it does not change it.
    bare = copy.deepcopy(cluster)
    for template in templates(bare):
        del template["metadata"]["annotations"][manifests.SPEC_HASH_ANNOTATION]
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
        # Pinned to the plugin's network: a node whose EFA fails stops at its first communicator.
        "NCCL_NET": "AWS Libfabric",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_DEBUG": "INFO",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "110",
        "AWS_REGION": "us-east-2",
        "AWS_DEFAULT_REGION": "us-east-2",
        "HF_TOKEN_PATH": "/var/run/secrets/huggingface/token",
        "NODE_IP": None,  # from the downward API
        "TRAINING_EFA_COUNTERS_URL": "http://$(NODE_IP):9478/",
        "K8S_NODE_NAME": None,  # from the downward API
    }
    from_pod = {
        item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"]
        for item in container["env"]
        if "valueFrom" in item
    }
    assert from_pod == {"NODE_IP": "status.hostIP", "K8S_NODE_NAME": "spec.nodeName"}
    pod = worker_group["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-worker"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}  # the size rule's cap
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_every_ray_pod_has_a_memory_backed_dev_shm_sized_from_its_memory(ray_cluster_schema):
    """The head too: without it, Ray's object store (30% of the pod's memory) would not fit a small
    /dev/shm and would go to disk. One rule for both pods; the manifests stay valid."""
    cluster = manifests.ray_cluster(spec())
    jsonschema.validate(cluster, ray_cluster_schema)
    head, worker = templates(cluster)
    for template, memory, size in ((head, "8Gi", "2704Mi"), (worker, "160Gi", "32Gi")):
        pod = template["spec"]
        [container] = pod["containers"]
        assert container["resources"]["limits"]["memory"] == memory
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert raycluster.shm_size(memory) == size
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
        check = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": pod}
        kubernetes_validate.validate(check, KUBERNETES_VERSION, strict=True)
    # A bigger head gets a bigger /dev/shm, and the spec hash follows it.
    bigger = manifests.ray_cluster(spec(head_memory="16Gi"))
    [shm] = [v for v in templates(bigger)[0]["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["sizeLimit"] == "5407Mi"


@pytest.mark.parametrize("memory", ["2Gi", "8Gi", "16Gi", "30Gi", "40Gi", "160Gi", "1000Gi"])
def test_ray_keeps_its_default_object_store_in_the_dev_shm_the_rule_gives(memory, monkeypatch):
    """Ray 2.58's own sizing (ray/_private/utils.py `resolve_object_store_memory`, services.py
    `determine_plasma_store_config`) on a pod whose /dev/shm is `shm_size(memory)`: the default store
    goes to /dev/shm, not to the temp folder on disk, whatever of the memory Ray finds free."""
    import ray._common.utils
    from ray._private import ray_constants, services
    from ray._private import utils as ray_utils

    share = raycluster.RAY_OBJECT_STORE_SHARE_PERCENT
    assert share == ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION * 100
    memory_bytes = parse_quantity(memory)
    shm_bytes = int(parse_quantity(raycluster.shm_size(memory)))
    monkeypatch.setattr(ray._common.utils, "get_system_memory", lambda *args: int(memory_bytes))
    for free in (memory_bytes, memory_bytes / 2):
        for shm in (shm_bytes, 64 * 2**20):
            monkeypatch.setattr(ray_utils, "get_shared_memory_bytes", lambda shm=shm: shm)
            store = ray_utils.resolve_object_store_memory(int(free))
            directory = services.determine_plasma_store_config(store, temp_dir="/tmp/ray")[0]
            if shm == shm_bytes:
                assert (directory, store <= shm) == ("/dev/shm", True), (free, store)
            else:  # the container runtime's 64 MiB: the store goes to disk
                assert directory == "/tmp/ray", (free, store)


def test_a_worker_pod_drains_ray_and_stops_it_before_the_kubelets_sigkill(ray_cluster_schema):
    """Deleted or drained, a worker pod gets SIGTERM, then SIGKILL once its grace has passed
    (Kubernetes docs, "Pod Lifecycle"). `ray start --block` drains the node for
    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, then stops its processes, a second each at most
    (ray/_private/node.py): the drain ends a margin before the grace does."""
    cluster = manifests.ray_cluster(spec())
    jsonschema.validate(cluster, ray_cluster_schema)
    pod = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    drain = float(env[manifests.DRAIN_TIMEOUT_ENV])
    assert grace == DEFAULT_GRACE_S > 30  # longer than Kubernetes' default of 30 s
    assert 0 < drain == grace - RAY_STOP_MARGIN_S
    assert RAY_STOP_MARGIN_S >= 6  # one second for each of a worker's Ray processes, about 6
    # The preview's grace, sized for the drain's checkpoint, is the one the pods get.
    sized = manifests.ray_cluster(dataclasses.replace(spec(), worker_grace_s=150))
    sized_pod = sized["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    sized_env = {item["name"]: item.get("value") for item in sized_pod["containers"][0]["env"]}
    assert (sized_pod["terminationGracePeriodSeconds"], sized_env[manifests.DRAIN_TIMEOUT_ENV]) == (
        150,
        "140",
    )
    # The head is not drained: its pod's end is the cluster's.
    assert "terminationGracePeriodSeconds" not in cluster["spec"]["headGroupSpec"]["template"]["spec"]


def test_ray_reads_the_drain_timeout_the_worker_pod_sets():
    """The variable is the one Ray 2.58 reads, as the number the pod gives (ray/_private/ray_constants.py)."""
    env = {item["name"]: item.get("value") for item in ray_pod_specs()[1]["containers"][0]["env"]}
    read = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ray._private import ray_constants; print(ray_constants.RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S)",
        ],
        env={**os.environ, manifests.DRAIN_TIMEOUT_ENV: env[manifests.DRAIN_TIMEOUT_ENV]},
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(read.stdout.strip()) == DEFAULT_GRACE_S - RAY_STOP_MARGIN_S


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


def test_hf_token_reaches_every_ray_pod_as_a_file_of_the_secret():
    """A file of an optional Secret volume that `HF_TOKEN_PATH` names; no variable of the pods holds it."""
    for pod in ray_pod_specs():
        [container] = pod["containers"]
        env = {item["name"]: item for item in container["env"]}
        assert "HF_TOKEN" not in env
        assert not [item for item in container["env"] if "secretKeyRef" in item.get("valueFrom", {})]
        [volume] = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == manifests.HF_TOKEN_SECRET
        assert volume["secret"]["optional"] is True and volume["secret"]["defaultMode"] == 0o400
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        [item] = volume["secret"]["items"]
        assert env["HF_TOKEN_PATH"]["value"] == f"{mount['mountPath']}/{item['path']}"
        secret = manifests.hf_token_secret("ray-train", "hf_example")
        assert secret["metadata"]["name"] == manifests.HF_TOKEN_SECRET and item["key"] in secret["stringData"]


@pytest.mark.parametrize("present", [True, False], ids=["token", "no-token"])
def test_huggingface_hub_reads_the_token_from_the_file_hf_token_path_names(tmp_path, present):
    """The pinned huggingface_hub (the image's, as requirements-train.txt says) reads the file that
    `HF_TOKEN_PATH` names when `HF_TOKEN` is unset, and no file (no Secret) means no token."""
    [env_item] = [
        item for item in ray_pod_specs()[1]["containers"][0]["env"] if item["name"] == "HF_TOKEN_PATH"
    ]
    token_file = tmp_path / env_item["value"].lstrip("/")
    if present:
        token_file.parent.mkdir(parents=True)
        token_file.write_text("hf_example\n")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    found = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.get_token())"],
        env={**environment, "HF_TOKEN_PATH": str(token_file), "HF_HOME": str(tmp_path / "hf-home")},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    assert found == ("hf_example" if present else "None")


def test_ray_pods_mount_no_kubernetes_api_token():
    """Ray calls no Kubernetes API here (no in-tree autoscaler): neither pod template nor the service
    account mounts a token; IRSA's own projected token does not depend on it."""
    cluster = manifests.ray_cluster(spec())
    assert cluster["spec"]["enableInTreeAutoscaling"] is False
    assert [pod["automountServiceAccountToken"] for pod in ray_pod_specs()] == [False, False]
    account = manifests.service_account("ray-train", "ray-train", "arn:aws:iam::123456789012:role/ray")
    assert account["automountServiceAccountToken"] is False


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


def test_ray_token_authentication_is_on_and_kuberay_makes_and_wires_the_token(ray_cluster_schema):
    """`authOptions: {mode: token}` without `secretName`: KubeRay 1.7.0 creates the token's Secret
    itself and sets RAY_AUTH_MODE and RAY_AUTH_TOKEN in each Ray container, but only where the
    container lacks them (ray-operator/controllers/ray/common/pod.go, `SetContainerTokenAuthEnvVars`
    skips a variable `EnvVarExists` finds), so the templates leave both to it."""
    cluster = manifests.ray_cluster(spec())
    assert cluster["spec"]["authOptions"] == manifests.RAY_AUTH_OPTIONS == {"mode": "token"}
    allowed = ray_cluster_schema["properties"]["spec"]["properties"]["authOptions"]["properties"]
    assert "token" in allowed["mode"]["enum"]
    for pod in ray_pod_specs():
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            assert not [item for item in container["env"] if item["name"].startswith("RAY_AUTH_")]
    # The Secret KubeRay creates is named after the RayCluster, the token under `auth_token`
    # (raycluster_controller.go, `reconcileAuthSecret`; utils/constant.go).
    assert manifests.ray_auth_token_command("ray-train", "ray-ns") == (
        "kubectl -n ray-ns get secret ray-train -o jsonpath='{.data.auth_token}' | base64 -d"
    )
