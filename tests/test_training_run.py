"""The TrainingRun dynamic resource: its checks, failure messages, re-run triggers and job flow.

Three levels, no cloud anywhere:

- pure logic (job arguments, input checks, diff, job identity, log parsing);
- the provider against a fake Kubernetes API: real `kubernetes.client` models served by fake
  `CoreV1Api`/`CustomObjectsApi` objects, a fake head pod that answers the Ray commands by
  replaying driver logs from `tests/fixtures/training_run`, and worker pods whose session log
  folders are fixture folders, read by the very shell commands the provider runs in the pods;
- end to end with a real local Ray head (`ray start --head` here, stopped afterwards): the
  provider's `create`, with its executor swapped from pod exec to local exec, submits the tiny
  CPU training job, waits, reads its logs and reports.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import boto3
import dill
import pulumi
import pytest
import websocket
from botocore.stub import Stubber
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc

from infra.aws_identity import AwsCredentialSettings
from infra.config import ConfigError, parse_settings
from infra.training_settings import PROGRAM_FLAGS, TrainingSettings, job_arguments
from tests.fake_kube_api import ScriptedJob
from tests.program import STACK_FILES, USER_SETTINGS, stack_config
from training.config import parse_args
from workloads import manifests
from workloads.training_run import (
    eks_auth,
    errors,
    evidence,
    jobs,
    kube_access,
    provider,
    readiness,
    runner,
    schema,
)
from workloads.training_run.kube_access import ExecResult, KubernetesCluster, LocalExecutor, _exec_status

FIXTURES = Path(__file__).parent / "fixtures" / "training_run"
POD_LOGS = FIXTURES / "pods"
WORKER_PODS = sorted(path.name for path in POD_LOGS.iterdir())
HEAD_POD = "ray-train-head-9bq5w"
CODE_HASH = "5f0c2a9d81e4b7c3"
SPEC_HASH = "7e1f0c2b9a4d8e63"
EFA_JOB, TCP_JOB, FALLBACK_JOB, OOM_JOB = "02000000", "03000000", "01000000", "04000000"


# --- fakes of the Kubernetes API ------------------------------------------------------------------


def gpu_node(
    name: str, gpus: str | None = "4", efa: str | None = "1", present: bool = True, ready: bool = True
):
    allocatable = {"cpu": "47810m", "memory": "187655916Ki"}
    if gpus is not None:
        allocatable[readiness.GPU_RESOURCE] = gpus
    if efa is not None:
        allocatable[readiness.EFA_RESOURCE] = efa
    labels = {"role": "gpu-worker", "node.kubernetes.io/instance-type": "g6.12xlarge"}
    if present:
        labels[readiness.GPU_PRESENT_LABEL] = "true"
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels),
        status=k8s.V1NodeStatus(
            allocatable=allocatable,
            conditions=[k8s.V1NodeCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def ray_pod(
    name: str,
    node_type: str,
    ready: bool = True,
    phase: str = "Running",
    node: str | None = "node-a",
    waiting: tuple[str, str] | None = None,
    spec_hash: str | None = SPEC_HASH,
    deleting: bool = False,
    uid: str | None = None,
):
    """A Ray pod as KubeRay creates it: its template's annotations, here the spec hash, carried over;
    the API server gives each pod a UID (one per pod object: `uid` models one created again)."""
    container = "ray-head" if node_type == "head" else "ray-worker"
    state = k8s.V1ContainerState(
        waiting=k8s.V1ContainerStateWaiting(reason=waiting[0], message=waiting[1]) if waiting else None
    )
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace="ray-train",
            uid=uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            labels={"ray.io/cluster": "ray-train", "ray.io/node-type": node_type},
            annotations={manifests.SPEC_HASH_ANNOTATION: spec_hash} if spec_hash else None,
            deletion_timestamp=datetime.datetime(2026, 5, 11, 9, 0, tzinfo=datetime.UTC)
            if deleting
            else None,
        ),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name=container)], node_name=node),
        status=k8s.V1PodStatus(
            phase=phase,
            conditions=[k8s.V1PodCondition(type="Ready", status="True" if ready else "False")],
            container_statuses=[
                k8s.V1ContainerStatus(
                    name=container, image="ray", image_id="", ready=ready, restart_count=0, state=state
                )
            ],
        ),
    )


def pod_event(pod: str, reason: str, message: str, kind: str = "Warning", minute: int = 0):
    return k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name=f"{pod}.{minute}"),
        involved_object=k8s.V1ObjectReference(kind="Pod", name=pod),
        type=kind,
        reason=reason,
        message=message,
        count=3,
        last_timestamp=datetime.datetime(2026, 5, 11, 9, minute, tzinfo=datetime.UTC),
    )


def _selected(labels: dict, selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all((labels or {}).get(key) == value for key, value in wanted.items())


class FakeCoreApi:
    """The `CoreV1Api` calls the provider makes; `node_snapshots` are served one per call, the last repeats."""

    def __init__(self, node_snapshots, pod_snapshots, events=()):
        self.node_snapshots = list(node_snapshots)
        self.pod_snapshots = list(pod_snapshots)
        self.events = list(events)
        self.node_calls = 0
        self.pod_calls = 0

    def list_node(self, label_selector, **_request_options):
        nodes = self.node_snapshots[min(self.node_calls, len(self.node_snapshots) - 1)]
        self.node_calls += 1
        return k8s.V1NodeList(items=[n for n in nodes if _selected(n.metadata.labels, label_selector)])

    def list_namespaced_pod(self, namespace, label_selector, **_request_options):
        pods = self.pod_snapshots[
            min(self.pod_calls // 2, len(self.pod_snapshots) - 1)
        ]  # head + workers per wait
        self.pod_calls += 1
        return k8s.V1PodList(
            items=[
                p
                for p in pods
                if p.metadata.namespace == namespace and _selected(p.metadata.labels, label_selector)
            ]
        )

    def list_namespaced_event(self, namespace, field_selector, **_request_options):
        wanted = dict(term.split("=", 1) for term in field_selector.split(","))
        return k8s.CoreV1EventList(
            items=[e for e in self.events if e.involved_object.name == wanted["involvedObject.name"]]
        )


class FakeCustomObjects:
    def __init__(self, worker_replicas: int | None = 2):
        self.worker_replicas = worker_replicas

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_request_options):
        if self.worker_replicas is None:
            raise ApiException(status=404, reason="Not Found")
        assert (group, version, plural) == ("ray.io", "v1", "rayclusters")
        return {
            "spec": {"workerGroupSpecs": [{"groupName": "gpu-workers", "replicas": self.worker_replicas}]}
        }


# --- fakes of the pods --------------------------------------------------------------------------


class FakeRayHead:
    """The head pod: answers `cat .code-hash`, `ray job submit` and the Jobs API script like a Ray head would."""

    def __init__(self, jobs_by_variant: dict[str, ScriptedJob], code_hashes=(CODE_HASH,)):
        self.jobs_by_variant = jobs_by_variant
        self.code_hashes = list(code_hashes)
        self.jobs: dict[str, ScriptedJob] = {}
        self.metadata: dict[str, dict] = {}  # what `--metadata-json` attached, per submission id
        self.submissions: list[list[str]] = []

    def run(self, argv, timeout_s):
        if argv[0] == "cat":
            assert argv[1] == f"{manifests.CODE_MOUNT}/{manifests.CODE_HASH_FILE}"
            seen = self.code_hashes.pop(0) if len(self.code_hashes) > 1 else self.code_hashes[0]
            return ExecResult(0, seen + "\n")
        if argv[:3] == ["ray", "job", "submit"]:
            assert argv[argv.index("--address") + 1] == jobs.DASHBOARD_ADDRESS
            submission_id = argv[argv.index("--submission-id") + 1]
            if submission_id in self.jobs:
                return ExecResult(1, "", f"Job with submission_id {submission_id} already exists.")
            env = {}
            if "--runtime-env-json" in argv:
                env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
            self.jobs[submission_id] = self.jobs_by_variant[
                "tcp" if env.get("NCCL_NET") == "Socket" else "main"
            ]
            if "--metadata-json" in argv:
                self.metadata[submission_id] = json.loads(argv[argv.index("--metadata-json") + 1])
            self.submissions.append(list(argv))
            return ExecResult(0, f"Job '{submission_id}' submitted successfully\n")
        if argv[:3] == ["python", "-c", jobs.HEAD_JOBS_API_SOURCE]:
            action, subject = argv[4], argv[5]
            if action == "list":
                listed = [
                    {
                        "submission_id": sid,
                        "job_id": job.ray_job_id,
                        "status": job.status(),
                        "message": None,
                        "metadata": self.metadata.get(sid, {}),
                    }
                    for sid, job in self.jobs.items()
                    if sid.startswith(subject)
                ]
                return ExecResult(0, json.dumps({"jobs": listed}) + "\n")
            job = self.jobs.get(subject)
            if job is None:
                return ExecResult(0, json.dumps({"job": None, "logs": "", "offset": 0}) + "\n")
            status, logs = job.status(), job.logs()
            job.looks += 1
            offset = int(argv[6])
            record = {
                "submission_id": subject,
                "job_id": job.ray_job_id,
                "status": status,
                "message": job.message if status == "FAILED" else None,
                "metadata": self.metadata.get(subject, {}),
            }
            return ExecResult(
                0, json.dumps({"job": record, "logs": logs[offset:], "offset": len(logs)}) + "\n"
            )
        raise AssertionError(f"the head pod got an unexpected command: {argv[:4]}")


def stamp_write_order(logs: Path) -> None:
    """Give the fixture logs the modification times Ray's writes would leave: `.out` files first,
    then each worker's `.err`, where a dying worker writes its traceback last; by pid (Ray's start
    order) within each, a rotated part (`.out.2`, `.out.1`) before the newer ones. A checkout
    stamps files in whatever order it writes them, and the tail command orders by time (`ls -tr`),
    so the fixture's order is set here, not left to git."""

    def written(path: Path) -> tuple[bool, int, int]:
        pid, kind, *rotated = path.name.rsplit("-", 1)[1].split(".")
        return kind == "err", int(pid), -int(rotated[0]) if rotated else 0

    files = sorted(logs.glob("worker-*"), key=written)
    for second, path in enumerate(files):
        os.utime(path, (1_700_000_000 + second, 1_700_000_000 + second))


class FixturePod:
    """A worker pod whose Ray session log folder is a fixture folder and whose NCCL log folder
    (the emptyDir `/tmp/ray`) is `nccl_logs` (the fixtures' pod folder holds no NCCL log files: jobs
    submitted before they existed); commands really run, here."""

    def __init__(self, name: str, logs: Path | None = None, nccl_logs: Path | None = None):
        self.logs = logs or POD_LOGS / name / "logs"
        self.nccl_logs = nccl_logs or POD_LOGS / name
        stamp_write_order(self.logs)
        self.commands: list[list[str]] = []

    def run(self, argv, timeout_s):
        self.commands.append(list(argv))
        local = {evidence.RAY_LOG_DIR: str(self.logs), jobs.NCCL_LOG_DIR: str(self.nccl_logs)}
        return LocalExecutor().run([local.get(arg, arg) for arg in argv], timeout_s)


class FakeClock:
    """Time that passes only when the provider sleeps."""

    def __init__(self):
        self.now = 0.0
        self.slept = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.slept += seconds


def driver_log(name: str) -> str:
    return (FIXTURES / name).read_text()


def scripted(ray_job_id: str, log_name: str, final: str = "SUCCEEDED", message: str | None = None):
    return ScriptedJob(ray_job_id, driver_log(log_name), ["PENDING", "RUNNING", "RUNNING", final], message)


@dataclass
class FakeCluster:
    """A whole fake cluster: nodes, pods, events, head, workers, clock, and the Pulumi log lines."""

    head: FakeRayHead
    nodes: list = field(default_factory=lambda: [gpu_node("node-a"), gpu_node("node-b")])
    node_snapshots: list | None = None
    pod_snapshots: list | None = None
    events: list = field(default_factory=list)
    worker_replicas: int | None = 2
    clock: FakeClock = field(default_factory=FakeClock)
    logged: list[str] = field(default_factory=list)

    def __post_init__(self):
        pods = [
            ray_pod(HEAD_POD, "head", node="system-node"),
            *(ray_pod(name, "worker") for name in WORKER_PODS),
        ]
        self.core = FakeCoreApi(
            self.node_snapshots or [self.nodes], self.pod_snapshots or [pods], self.events
        )
        self.workers = {name: FixturePod(name) for name in WORKER_PODS}

    def environment(self) -> runner.RunEnvironment:
        cluster = KubernetesCluster(self.core, FakeCustomObjects(self.worker_replicas))
        return runner.RunEnvironment(
            cluster,
            executor_for=lambda pod: self.head if pod.name == HEAD_POD else self.workers[pod.name],
            log=self.logged.append,
            clock=self.clock,
            sleep=self.clock.sleep,
        )

    def provider(self) -> provider.TrainingRunProvider:
        @contextlib.contextmanager
        def connect(inputs, aws, timings):
            yield self.environment()

        return provider.TrainingRunProvider(connect=connect)


SMOKE_ARGS = ["--preset", "smoke", "--workers", "8", "--use-gpu", "--gpus-per-worker", "1"]


def run_inputs(**changes) -> schema.RunInputs:
    values = {
        "cluster_name": "eks-ray-train",
        "region": "us-east-2",
        "namespace": "ray-train",
        "ray_cluster_name": "ray-train",
        "gpus_per_node": 4,
        "efa_per_node": 1,
        "code_hash": CODE_HASH,
        "run_spec_hash": SPEC_HASH,
        "gpu_instance_type": "g6.12xlarge",
        "job_args": tuple(SMOKE_ARGS),
    }
    values.update(changes)
    return schema.RunInputs(**values)


def props(inputs: schema.RunInputs) -> dict:
    """What the engine hands `create`: the inputs, and the declared outputs as nulls."""
    return {**inputs.props(), **dict.fromkeys(provider.OUTPUTS)}


def main_and_tcp_head(**main_changes) -> FakeRayHead:
    return FakeRayHead(
        {
            "main": replace(scripted(EFA_JOB, "driver_main.log"), **main_changes),
            "tcp": scripted(TCP_JOB, "driver_tcp.log"),
        }
    )


# --- job arguments ------------------------------------------------------------------------------------


SHIPPED = tuple(manifests.collect_code(Path(__file__).resolve().parent.parent))


def stack_training(block: dict) -> TrainingSettings:
    """A stack's `training:` block as the program reads it."""
    raw = {"endpointPublicAccessCidrs": '["203.0.113.7/32"]', "training": json.dumps(block)}
    return parse_settings(raw, "us-east-2").training


def test_job_arguments_are_the_stack_flags_and_the_program_flags():
    training = stack_training(
        {
            "preset": "throughput",
            "modelId": "Qwen/Qwen2.5-0.5B",
            "init": "random",
            "steps": 20,
            "seqLen": 4096,
            "batchSize": 2,
            "learningRate": 3e-5,
            "workers": 4,
            "checkpointEvery": 10,
            "hsdpReplicas": "auto",
            "compile": False,
            "expectTransport": "socket",
        }
    )
    args = job_arguments(
        training, world_size=8, gpus_per_worker=1, storage_path="s3://bucket/runs", shipped_files=SHIPPED
    )
    assert args == [
        *("--preset", "throughput", "--steps", "20", "--seq-len", "4096", "--batch-size", "2"),
        *("--lr", "3e-05", "--workers", "4", "--model-id", "Qwen/Qwen2.5-0.5B", "--init", "random"),
        *("--checkpoint-every", "10", "--hsdp-replicas", "auto", "--no-compile"),
        *("--use-gpu", "--gpus-per-worker", "1", "--storage-path", "s3://bucket/runs"),
    ]


def test_job_arguments_default_to_every_gpu_and_leave_unset_settings_to_the_preset():
    for preset, hsdp_replicas in (("smoke", 1), ("throughput", 0)):
        args = job_arguments(
            stack_training({"preset": preset}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/runs",
            shipped_files=SHIPPED,
        )
        assert args[args.index("--workers") + 1] == "8"
        for flag in ("--steps", "--seq-len", "--batch-size", "--lr", "--checkpoint-every", "--hsdp-replicas"):
            assert flag not in args
        assert parse_args(args).hsdp_replicas == hsdp_replicas


def test_job_arguments_parse_with_the_training_cli():
    """Every flag exists in `python -m training`, the values survive its validation, and the flags
    the program owns have the values the cluster needs."""
    training = stack_training(
        {
            "steps": 7,
            "seqLen": 256,
            "batchSize": 2,
            "learningRate": 1e-4,
            "workers": 6,
            "hsdpReplicas": "auto",
        }
    )
    config = parse_args(
        job_arguments(
            training, world_size=8, gpus_per_worker=1, storage_path="s3://b/runs", shipped_files=SHIPPED
        )
    )
    assert (config.preset, config.steps, config.seq_len, config.batch_size, config.lr) == (
        "smoke",
        7,
        256,
        2,
        1e-4,
    )
    assert (config.workers, config.use_gpu, config.gpus_per_worker, config.hsdp_replicas) == (6, True, 1.0, 0)
    assert config.storage_path == "s3://b/runs"
    assert (config.local, config.launcher) == (False, "ray")
    assert set(PROGRAM_FLAGS) == {"--storage-path", "--use-gpu", "--gpus-per-worker", "--local", "--launcher"}


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def test_stack_files_run_the_job_they_ran_before(stack_file):
    """The flags the program passed before the stack's `training:` keys became flags of the
    training parser (preset smoke, 20 steps, 2 x g6.12xlarge) give the same job."""
    before = [
        *("--preset", "smoke", "--model-id", "Qwen/Qwen2.5-1.5B", "--init", "pretrained", "--workers", "8"),
        *("--use-gpu", "--gpus-per-worker", "1", "--hsdp-replicas", "1", "--storage-path", "s3://b/runs"),
        *("--steps", "20"),
    ]
    config = stack_config(stack_file)
    settings = parse_settings(
        {
            key.split(":", 1)[1]: value
            for key, value in {**config, **USER_SETTINGS}.items()
            if key.startswith("eks-ray-train:")
        },
        config["aws:region"],
    )
    now = job_arguments(
        settings.training, world_size=8, gpus_per_worker=1, storage_path="s3://b/runs", shipped_files=SHIPPED
    )
    assert now == [
        *("--preset", "smoke", "--steps", "20", "--workers", "8"),
        *("--use-gpu", "--gpus-per-worker", "1", "--storage-path", "s3://b/runs"),
    ]
    assert replace(parse_args(now), run_name="") == replace(parse_args(before), run_name="")


def test_job_arguments_refuse_more_workers_than_gpus():
    with pytest.raises(ConfigError, match=r"'training.workers' = 9.*hold 8 workers"):
        job_arguments(
            stack_training({"workers": 9}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )


def test_job_arguments_check_the_worker_count_against_the_stack_settings():
    with pytest.raises(ConfigError) as raised:
        job_arguments(
            stack_training({"hsdpReplicas": 3}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )
    assert str(raised.value) == (
        "config key 'training': 8 workers are not a multiple of hsdpReplicas 3 "
        "(workers is the GPU count of the GPU nodes, 8)"
    )


# --- inputs, diff, identity ---------------------------------------------------------------------


def test_check_accepts_good_inputs_and_unknown_values_of_a_preview():
    checker = provider.TrainingRunProvider()
    good = props(run_inputs())
    assert checker.check({}, good).failures == []
    for unknown in (rpc.UNKNOWN, pulumi.output.Unknown()):  # the wire form, and what the host hands over
        preview = {**good, "code_hash": unknown, "job_args": unknown, "run_spec_hash": unknown}
        assert checker.check({}, preview).failures == []


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("gpus_per_node", 0, "at least 1"),
        ("gpus_per_node", 2.5, "whole number"),
        ("efa_per_node", 0, "efa transport needs at least 1 EFA"),
        ("job_args", "--steps 5", "list of strings"),
        ("expect_transport", "tcp", "one of efa, socket, ib, intra-node"),
        ("expect_transport", "unknown", "one of efa, socket, ib, intra-node"),
        ("timeout_minutes", 0, "at least 1"),
        ("cluster_name", "", "non-empty"),
        ("benchmark", "yes", "true or false"),
    ],
)
def test_check_names_the_bad_input(key, value, reason):
    failures = provider.TrainingRunProvider().check({}, {**props(run_inputs()), key: value}).failures
    assert [(f.property, reason in f.reason) for f in failures] == [(key, True)]


def test_check_requires_every_input():
    inputs = props(run_inputs())
    del inputs["code_hash"]
    failures = provider.TrainingRunProvider().check({}, inputs).failures
    assert [(f.property, f.reason) for f in failures] == [("code_hash", "is required")]


def test_no_efa_is_fine_when_efa_is_not_expected():
    assert (
        schema.input_problems({**props(run_inputs()), "efa_per_node": 0, "expect_transport": "socket"}) == []
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("code_hash", "0000000000000000"),
        ("job_args", [*SMOKE_ARGS, "--steps", "20"]),
        ("benchmark", True),
        ("expect_transport", "socket"),
        ("cluster_name", "other"),
        ("region", "us-west-2"),
        ("namespace", "other"),
        ("ray_cluster_name", "other"),
        ("gpus_per_node", 8),
        ("efa_per_node", 2),
        ("run_spec_hash", "0" * 16),
        ("gpu_instance_type", "g6.48xlarge"),
    ],
)
def test_diff_reruns_when_code_or_training_config_changes(key, value):
    olds = {**props(run_inputs()), "job_id": "eks-ray-train-main-0123456789ab", "status": "SUCCEEDED"}
    result = provider.TrainingRunProvider().diff("id", olds, {**props(run_inputs()), key: value})
    assert result.changes is True and result.replaces == [key]


def test_diff_is_a_noop_otherwise():
    olds = {**props(run_inputs()), "job_id": "eks-ray-train-main-0123456789ab", "tokens_per_s": 531.0}
    olds["gpus_per_node"] = 4.0  # numbers come back from the state as floats
    assert provider.TrainingRunProvider().diff("id", olds, props(run_inputs())).changes is False
    assert (
        provider.TrainingRunProvider()
        .diff("id", olds, {**props(run_inputs()), "timeout_minutes": 90})
        .changes
        is False
    )


def test_diff_reruns_when_an_input_is_not_known_yet():
    news = {**props(run_inputs()), "code_hash": rpc.UNKNOWN}
    assert provider.TrainingRunProvider().diff("id", props(run_inputs()), news).replaces == ["code_hash"]


def test_submission_id_is_stable_and_follows_what_the_job_runs():
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    assert base == jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    assert base.startswith("eks-ray-train-main-")
    assert base == jobs.submission_id_base(
        run_inputs(expect_transport="socket", timeout_minutes=5).job_identity(), "main", {}
    )
    others = {
        jobs.submission_id_base(run_inputs(code_hash="1" * 16).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(job_args=("--steps", "9")).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(cluster_name="b").job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(run_spec_hash="2" * 16).job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs(gpu_instance_type="g6.48xlarge").job_identity(), "main", {}),
        jobs.submission_id_base(run_inputs().job_identity(), "tcp", runner.TCP_BASELINE_ENV),
        jobs.submission_id_base(
            run_inputs().job_identity(), "tcp", {**runner.TCP_BASELINE_ENV, "NCCL_SOCKET_NTHREADS": "8"}
        ),
    }
    assert base not in others and len(others) == 7


PODS_NOW, OTHER_PODS = "head=u1 worker-a=u2", "head=u1 worker-a=u3"


@pytest.mark.parametrize(
    "existing, expected, adopted",
    [
        ([], "B", None),
        ([("B", "RUNNING", OTHER_PODS)], "B", "RUNNING"),
        ([("B", "PENDING", None)], "B", "PENDING"),
        ([("B", "SUCCEEDED", PODS_NOW)], "B", "SUCCEEDED"),
        ([("B", "SUCCEEDED", OTHER_PODS)], "B-2", None),
        ([("B", "SUCCEEDED", None)], "B-2", None),
        ([("B", "FAILED", PODS_NOW)], "B-2", None),
        ([("B", "FAILED", None), ("B-2", "STOPPED", None)], "B-3", None),
        ([("B", "SUCCEEDED", None), ("B-2", "FAILED", None), ("B-10", "RUNNING", None)], "B-10", "RUNNING"),
        ([("B", "SUCCEEDED", PODS_NOW), ("B-2", "SUCCEEDED", OTHER_PODS)], "B-3", None),
        ([("B-other", "RUNNING", None), ("BB", "RUNNING", None)], "B", None),
    ],
)
def test_plan_submission_adopts_live_jobs_judges_done_ones_again_only_on_their_pods(
    existing, expected, adopted
):
    records = [
        jobs.JobRecord(sid, jobs.JobStatus(status), metadata={jobs.PODS_METADATA: pods} if pods else {})
        for sid, status, pods in existing
    ]
    plan = jobs.plan_submission(records, "B", PODS_NOW)
    assert plan.submission_id == expected
    assert (plan.adopted.status if plan.adopted else None) == adopted
    if existing and existing[-1][1] == "SUCCEEDED":
        assert plan.note and existing[-1][0] in plan.note


def test_submit_command_ships_the_code_and_names_the_run_after_the_job():
    argv = jobs.submit_command(
        jobs.DASHBOARD_ADDRESS, "job-1", "/opt/eks-ray-train", SMOKE_ARGS, runner.TCP_BASELINE_ENV, PODS_NOW
    )
    assert json.loads(argv[argv.index("--metadata-json") + 1]) == {jobs.PODS_METADATA: PODS_NOW}
    assert argv[argv.index("--runtime-env-json") + 1].count("NCCL_DEBUG_FILE") == 1
    assert argv[:5] == ["ray", "job", "submit", "--address", "http://localhost:8265"]
    assert argv[argv.index("--working-dir") + 1] == "/opt/eks-ray-train"
    assert "--no-wait" in argv and argv[argv.index("--submission-id") + 1] == "job-1"
    entrypoint = argv[argv.index("--") + 1 :]
    assert entrypoint == ["python", "-m", "training", *SMOKE_ARGS, "--run-name", "job-1"]
    env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
    assert env["NCCL_DEBUG_FILE"] == "/tmp/ray/nccl-job-1.%h.%p.log"  # NCCL: %h host, %p pid
    assert env["NCCL_NET"] == "Socket" and env["NCCL_NET_PLUGIN"] == "none"
    assert int(env["NCCL_SOCKET_NTHREADS"]) * int(env["NCCL_NSOCKS_PERTHREAD"]) > 1
    plain = jobs.submit_command(jobs.DASHBOARD_ADDRESS, "j", "/c", SMOKE_ARGS, {}, PODS_NOW)
    assert json.loads(plain[plain.index("--runtime-env-json") + 1]) == {
        "env_vars": {"NCCL_DEBUG_FILE": "/tmp/ray/nccl-j.%h.%p.log"}
    }


def test_job_log_parses_steps_across_chunks_and_finds_the_summary():
    text = driver_log("driver_main.log")
    log = evidence.JobLog()
    steps = []
    for start in range(0, len(text), 97):  # chunks split lines anywhere
        steps += log.feed(text[start : start + 97])
    steps += log.close()
    assert [step["step"] for step in steps] == [1, 2, 3, 4, 5]
    assert log.summary()["tokens_per_s"] == 530.6 and log.summary()["world_size"] == 8
    assert len(log.nccl_lines) == 3


# --- node and pod checks against the fake Kubernetes API -------------------------------------------------


def failure_of(fake: FakeCluster, inputs: schema.RunInputs | None = None) -> str:
    with pytest.raises(errors.TrainingRunError) as caught:
        fake.provider().create(props(inputs or run_inputs()))
    return str(caught.value)


@pytest.mark.parametrize(
    "node, expected",
    [
        (
            gpu_node("node-b", gpus=None),
            "node node-b: allocatable nvidia.com/gpu is absent, expected 4 (is the nvidia-device-plugin",
        ),
        (gpu_node("node-b", gpus="2"), "node node-b: allocatable nvidia.com/gpu is 2, expected 4"),
        (
            gpu_node("node-b", efa=None),
            "node node-b: allocatable vpc.amazonaws.com/efa is absent, expected at least 1 (is the aws-efa-k8s-device-plugin",
        ),
        (
            gpu_node("node-b", efa="0"),
            "node node-b: allocatable vpc.amazonaws.com/efa is 0, expected at least 1",
        ),
        (gpu_node("node-b", present=False), "node node-b: label nvidia.com/gpu.present=true is missing"),
        (gpu_node("node-b", ready=False), "node node-b: the node is not Ready"),
    ],
)
def test_a_gpu_node_without_what_the_job_needs_fails_naming_node_and_resource(node, expected):
    fake = FakeCluster(main_and_tcp_head(), nodes=[gpu_node("node-a"), node])
    message = failure_of(fake)
    assert "GPU nodes cannot run the training job after 20 min" in message
    assert expected in message and "node node-a" not in message
    assert fake.head.submissions == []


def test_missing_gpu_nodes_are_named():
    assert "no node carries the label role=gpu-worker" in failure_of(
        FakeCluster(main_and_tcp_head(), nodes=[])
    )
    fewer = failure_of(FakeCluster(main_and_tcp_head(), nodes=[gpu_node("node-a")]))
    assert "1 GPU nodes for 2 Ray worker pods" in fewer


def test_the_run_waits_while_the_device_plugins_register():
    fake = FakeCluster(
        main_and_tcp_head(),
        node_snapshots=[
            [gpu_node("node-a", gpus=None, efa=None), gpu_node("node-b", efa=None)],
            [gpu_node("node-a"), gpu_node("node-b", efa=None)],
            [gpu_node("node-a"), gpu_node("node-b")],
        ],
    )
    outputs = fake.provider().create(props(run_inputs())).outs
    assert outputs["transport"] == "efa"
    assert fake.core.node_calls == 3 and fake.clock.slept >= 2 * 10


def test_pods_that_never_get_ready_fail_with_phases_and_events():
    stuck = [
        ray_pod(HEAD_POD, "head", node="system-node"),
        ray_pod(WORKER_PODS[0], "worker"),
        ray_pod(WORKER_PODS[1], "worker", ready=False, phase="Pending", node=None),
    ]
    events = [
        pod_event(
            WORKER_PODS[1],
            "FailedScheduling",
            "0/3 nodes are available: 2 Insufficient vpc.amazonaws.com/efa.",
            minute=3,
        ),
        pod_event(WORKER_PODS[1], "Scheduled", "never", kind="Normal", minute=1),
        pod_event(HEAD_POD, "Pulled", "image pulled", kind="Normal"),
    ]
    message = failure_of(FakeCluster(main_and_tcp_head(), pod_snapshots=[stuck], events=events))
    assert (
        "RayCluster ray-train/ray-train is not ready after 20 min: waiting for 1 of 2 worker pods (2 exist)"
        in message
    )
    assert f"{WORKER_PODS[1]}: Pending, not Ready (not scheduled)" in message
    assert (
        "event Warning FailedScheduling: 0/3 nodes are available: 2 Insufficient vpc.amazonaws.com/efa. (x3)"
        in message
    )
    assert f"{WORKER_PODS[0]}: Running, Ready on node-a" in message


def test_pod_container_problems_are_reported():
    pulling = [
        ray_pod(
            HEAD_POD,
            "head",
            ready=False,
            phase="Pending",
            waiting=("ImagePullBackOff", "Back-off pulling image"),
        ),
        *(ray_pod(name, "worker") for name in WORKER_PODS),
    ]
    message = failure_of(FakeCluster(main_and_tcp_head(), pod_snapshots=[pulling]))
    assert "waiting for the head pod" in message
    assert "ray-head ImagePullBackOff: Back-off pulling image" in message


def test_no_pods_at_all_points_at_the_operator():
    message = failure_of(FakeCluster(main_and_tcp_head(), pod_snapshots=[[]]))
    assert "a head pod (none exists yet)" in message and "is the KubeRay operator running?" in message


def test_a_missing_raycluster_is_reported():
    with pytest.raises(Exception, match="RayCluster ray-train/ray-train does not exist"):
        FakeCluster(main_and_tcp_head(), worker_replicas=None).provider().create(props(run_inputs()))


def test_the_run_waits_for_the_new_code_before_submitting():
    head = main_and_tcp_head()
    head.code_hashes = ["0ld0ld0ld0ld0ld0", "0ld0ld0ld0ld0ld0", CODE_HASH]
    fake = FakeCluster(head)
    fake.provider().create(props(run_inputs()))
    assert len(head.submissions) == 1 and head.code_hashes == [CODE_HASH]


# --- pods of the current RayCluster spec only --------------------------------------------------------

OLD_SPEC = "0ld5pec0ld5pec00"


def old_and_new_pods() -> list[list]:
    """A RayCluster just patched by `pulumi up`, as KubeRay (upgradeStrategy Recreate) moves it on.

    kuberay v1.7.0 `raycluster_controller.go`: once the head pod's hash of the spec differs,
    `shouldRecreatePodsForUpgrade` holds and `reconcilePods` deletes every pod; the next reconcile
    creates them from the new templates, which carry the new spec hash. (The fake keeps the pod
    names; KubeRay generates new ones.)
    """

    def pods(**kwargs) -> list:
        return [
            ray_pod(HEAD_POD, "head", node="system-node", **kwargs),
            *(ray_pod(name, "worker", **kwargs) for name in WORKER_PODS),
        ]

    return [
        pods(spec_hash=OLD_SPEC),  # still Ready: KubeRay has not reconciled the patch yet
        pods(spec_hash=OLD_SPEC, deleting=True),
        pods(ready=False, phase="Pending"),
        pods(),
    ]


def test_the_run_waits_for_the_pods_of_the_new_spec():
    """Right after the patch the old pods are still Ready: no job may go to a head KubeRay deletes."""
    head = main_and_tcp_head()
    fake = FakeCluster(head, pod_snapshots=old_and_new_pods())
    outputs = fake.provider().create(props(run_inputs())).outs
    assert outputs["transport"] == "efa"
    assert fake.core.pod_calls == 2 * 4 and fake.clock.slept >= 3 * 10
    assert len(head.submissions) == 1
    assert f"2 worker pods Ready, all of RayCluster spec {SPEC_HASH}" in "\n".join(fake.logged)


def test_pods_left_on_another_spec_fail_naming_both_hashes_and_the_fix():
    stale = [ray_pod(HEAD_POD, "head", node="system-node", spec_hash=OLD_SPEC)]
    stale += [ray_pod(name, "worker", spec_hash=None) for name in WORKER_PODS]
    fake = FakeCluster(main_and_tcp_head(), pod_snapshots=[stale])
    message = failure_of(fake)
    assert "waiting for the head pod and 2 of 2 worker pods (2 exist)" in message
    assert f"runs RayCluster spec {OLD_SPEC}, not {SPEC_HASH}" in message
    assert f"runs RayCluster spec (none recorded), not {SPEC_HASH}" in message
    assert "kubectl -n ray-train delete pod -l ray.io/cluster=ray-train" in message
    assert fake.head.submissions == []


def test_only_ready_pods_of_the_expected_spec_count():
    current = [ray_pod(HEAD_POD, "head"), *(ray_pod(name, "worker") for name in WORKER_PODS)]
    facts = [kube_access._pod_facts(pod) for pod in current]
    head, workers = facts[0], facts[1:]
    assert readiness.pods_waiting_for([head], workers, 2, SPEC_HASH) == []
    assert readiness.pods_waiting_for([head], workers, 2, OLD_SPEC) == [
        "the head pod",
        "2 of 2 worker pods (2 exist)",
    ]
    assert readiness.runs_spec(head, SPEC_HASH) and not readiness.runs_spec(head, OLD_SPEC)
    unmarked = kube_access._pod_facts(ray_pod(HEAD_POD, "head", spec_hash=None))
    assert not readiness.runs_spec(unmarked, SPEC_HASH)
    assert "runs RayCluster spec" not in readiness.describe_pod(head, [], SPEC_HASH)


def test_stale_code_in_the_head_pod_fails_with_both_hashes():
    head = main_and_tcp_head()
    head.code_hashes = ["0ld0ld0ld0ld0ld0"]
    message = failure_of(FakeCluster(head))
    assert (
        f"head pod {HEAD_POD} sees code hash 0ld0ld0ld0ld0ld0 in /opt/eks-ray-train/.code-hash, not {CODE_HASH}"
        in message
    )
    # A container restart keeps the pod spec and its volumes: only a new pod mounts the ConfigMap afresh.
    assert "restart of the head pod picks it up" not in message
    assert "deleting the head pod makes KubeRay create it afresh" in message
    # A container restart keeps the pod spec and its volumes: only a new pod mounts the ConfigMap afresh.
    assert "restart of the head pod picks it up" not in message
    assert "deleting the head pod makes KubeRay create it afresh" in message
    assert head.submissions == []


# --- the job, its transport and the outputs ---------------------------------------------------------


def test_a_run_over_efa_outputs_job_transport_evidence_and_throughput():
    fake = FakeCluster(main_and_tcp_head())
    result = fake.provider().create(props(run_inputs()))
    outs = result.outs
    assert outs["job_id"].startswith("eks-ray-train-main-") and outs["status"] == "SUCCEEDED"
    assert outs["transport"] == "efa"
    assert any("via NET/Libfabric/0" in line for line in outs["evidence"])
    assert any("Selected provider is efa" in line for line in outs["evidence"])
    assert (outs["tokens_per_s"], outs["mfu"], outs["step_time_s"], outs["duration_s"]) == (
        530.6,
        0.00109,
        1.93,
        52.3,
    )
    assert outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 8)  # 4 workers x .out/.err of job 02000000
    assert outs["efa_speedup"] is None and outs["tcp_tokens_per_s"] is None
    assert {key: outs[key] for key in schema.INPUTS} == run_inputs().props()  # diff compares against these
    progress = [line for line in fake.logged if "step 5/5" in line]
    assert progress and "531 tok/s" in progress[0]


def test_worker_logs_of_other_jobs_never_reach_the_verdict():
    """The pods also hold job 01000000, which fell back to sockets: only the run's own files count."""
    fake = FakeCluster(main_and_tcp_head())
    assert fake.provider().create(props(run_inputs())).outs["transport"] == "efa"
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    for pod in fake.workers.values():
        assert pod.commands == [
            evidence.nccl_lines_command(jobs.NCCL_LOG_DIR, base, evidence.RAY_LOG_DIR, EFA_JOB)
        ]


def nccl_log_files(tmp_path: Path, submission_id: str) -> dict[str, FixturePod]:
    """The worker pods as a job with NCCL log files leaves them: NCCL wrote to its own file per
    process (`NCCL_DEBUG_FILE` expanded as NCCL does: `nccl-<id>.<host>.<pid>.log`), so the Ray
    worker logs hold no NCCL lines. Each pod also keeps a socket run's file of another submission."""
    pods = {}
    for name in WORKER_PODS:
        logs = shutil.copytree(POD_LOGS / name / "logs", tmp_path / name / "logs")
        nccl = tmp_path / name / "tmp-ray"
        nccl.mkdir()
        for out in logs.glob(f"worker-*-{EFA_JOB}-*.out"):
            lines = out.read_text().splitlines(keepends=True)
            pid = out.name.rsplit("-", 1)[1].split(".")[0]
            (nccl / f"nccl-{submission_id}.{name}.{pid}.log").write_text(
                "".join(line for line in lines if "NCCL" in line)
            )
            out.write_text("".join(line for line in lines if "NCCL" not in line))
        socket_run = next(logs.glob(f"worker-*-{FALLBACK_JOB}-*.out")).read_text()
        (nccl / f"nccl-{submission_id}-2.{name}.1.log").write_text(socket_run)
        pods[name] = FixturePod(name, logs, nccl)
    return pods


def test_the_jobs_nccl_log_files_are_read_one_per_rank(tmp_path):
    """NCCL's own line-buffered files of this submission decide; Ray's worker logs and the driver's
    relayed copy hold no NCCL line, and another submission's files (a socket run) never count."""
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    quiet = "".join(
        line for line in driver_log("driver_main.log").splitlines(keepends=True) if "NCCL" not in line
    )
    fake = FakeCluster(main_and_tcp_head(driver_log=quiet))
    fake.workers = nccl_log_files(tmp_path, base)
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["transport"] == "efa" and outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 4)
    assert any("via NET/Libfabric/0" in line for line in outs["evidence"])
    assert any(f"NCCL log files read: {dict.fromkeys(WORKER_PODS, 4)}" in line for line in fake.logged)


def test_a_rank_without_its_nccl_log_file_leaves_the_verdict_unknown(tmp_path):
    """The coverage floor holds over the NCCL log files: one judged process per rank."""
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    quiet = "".join(
        line for line in driver_log("driver_main.log").splitlines(keepends=True) if "NCCL" not in line
    )
    fake = FakeCluster(main_and_tcp_head(driver_log=quiet))
    fake.workers = nccl_log_files(tmp_path, base)
    next(fake.workers[WORKER_PODS[1]].nccl_logs.glob(f"nccl-{base}.*.log")).unlink()
    message = failure_of(fake)
    assert message.startswith("NCCL used 'unknown' between the nodes, not 'efa'")
    assert "the lines of only 7 NCCL processes on 2 hosts tell their transport" in message
    assert "nothing tells it for 1 of 8 ranks" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 4, '{WORKER_PODS[1]}': 3}}" in message
    assert f"/tmp/ray/nccl-{base}.*.log" in message


def test_an_efa_verdict_missing_a_worker_pod_is_unknown_and_names_what_is_missing(tmp_path):
    """A worker pod restarted since the job ran has lost its logs: the driver relays the lines of
    one of its four ranks, and four EFA ranks on one pod prove nothing about the other pod."""
    fake = FakeCluster(main_and_tcp_head())
    (tmp_path / "restarted").mkdir()
    fake.workers[WORKER_PODS[1]] = FixturePod(WORKER_PODS[1], tmp_path / "restarted")
    message = failure_of(fake)
    assert message.startswith("NCCL used 'unknown' between the nodes, not 'efa' (job eks-ray-train-main-")
    assert "the lines of only 5 NCCL processes on 2 hosts tell their transport (efa: " in message
    assert "nothing tells it for 3 of 8 ranks" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 8, '{WORKER_PODS[1]}': 0}}" in message


def test_a_verdict_must_cover_the_ranks_of_the_job_args():
    """`--workers` is the world size; without it the job runs one rank per GPU of the worker pods."""
    assert evidence.expected_coverage(SMOKE_ARGS, gpus_per_node=4, worker_pods=2) == (8, 2)
    assert evidence.expected_coverage(["--workers", "4"], gpus_per_node=4, worker_pods=2) == (4, 1)
    assert evidence.expected_coverage(["--workers=6"], gpus_per_node=4, worker_pods=2) == (6, 2)
    assert evidence.expected_coverage(["--preset", "smoke"], gpus_per_node=8, worker_pods=3) == (24, 3)


def test_rotated_worker_logs_are_read(tmp_path):
    """Ray rotates a worker's log by size: the oldest lines, NCCL's init and channel lines among
    them, move to `worker-...-<pid>.out.1` (Ray 2.58 with `RAY_ROTATION_MAX_BYTES`)."""
    fake = FakeCluster(main_and_tcp_head())
    for name in WORKER_PODS:
        logs = shutil.copytree(POD_LOGS / name / "logs", tmp_path / name)
        for out in logs.glob(f"worker-*-{EFA_JOB}-*.out"):
            out.rename(out.with_name(out.name + ".1"))
            out.write_text("TRAIN_STEP lines go on in the newer part\n")
        fake.workers[name] = FixturePod(name, logs)
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["transport"] == "efa"
    assert outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 12)  # 4 workers x .out.1/.out/.err


def test_a_tcp_fallback_fails_the_update_with_the_evidence():
    head = FakeRayHead({"main": scripted(FALLBACK_JOB, "driver_tcp.log")})
    message = failure_of(FakeCluster(head))
    assert message.startswith("NCCL used 'socket' between the nodes, not 'efa' (job eks-ray-train-main-")
    assert "NCCL processes used TCP sockets between nodes (channels via NET/Socket)" in message
    assert "via NET/Socket/0" in message and "NET/OFI aws-ofi-nccl initialization failed" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 8, '{WORKER_PODS[1]}': 8}}" in message


def test_expecting_another_transport_passes_when_it_is_found():
    head = FakeRayHead({"main": scripted(FALLBACK_JOB, "driver_tcp.log")})
    outs = FakeCluster(head).provider().create(props(run_inputs(expect_transport="socket"))).outs
    assert outs["transport"] == "socket"


def test_benchmark_runs_efa_then_a_fair_tcp_baseline_and_outputs_the_ratio():
    fake = FakeCluster(main_and_tcp_head())
    outs = fake.provider().create(props(run_inputs(benchmark=True))).outs
    main_submit, tcp_submit = fake.head.submissions
    main_env = json.loads(main_submit[main_submit.index("--runtime-env-json") + 1])["env_vars"]
    assert list(main_env) == ["NCCL_DEBUG_FILE"]  # the main run keeps the pods' NCCL settings
    tcp_env = json.loads(tcp_submit[tcp_submit.index("--runtime-env-json") + 1])["env_vars"]
    assert (tcp_env["NCCL_NET"], tcp_env["NCCL_NET_PLUGIN"]) == ("Socket", "none")
    assert (
        int(tcp_env["NCCL_SOCKET_NTHREADS"]) * int(tcp_env["NCCL_NSOCKS_PERTHREAD"]) >= 8
    )  # not one lone socket
    assert outs["tcp_job_id"].startswith("eks-ray-train-tcp-") and outs["tcp_job_id"] != outs["job_id"]
    assert (outs["transport"], outs["tcp_transport"]) == ("efa", "socket")
    assert any("via NET/Socket/0" in line for line in outs["tcp_evidence"])
    assert (outs["tokens_per_s"], outs["tcp_tokens_per_s"]) == (530.6, 258.6)
    assert outs["efa_speedup"] == round(530.6 / 258.6, 3) == 2.052


def test_a_benchmark_whose_baseline_did_not_use_sockets_fails():
    head = FakeRayHead(
        {"main": scripted(EFA_JOB, "driver_main.log"), "tcp": scripted(EFA_JOB, "driver_main.log")}
    )
    message = failure_of(FakeCluster(head), run_inputs(benchmark=True))
    assert "NCCL used 'efa' between the nodes, not 'socket' (job eks-ray-train-tcp-" in message


def test_a_failed_job_shows_the_driver_and_worker_log_tails():
    head = FakeRayHead(
        {
            "main": scripted(
                OOM_JOB,
                "driver_failed.log",
                final="FAILED",
                message="Job entrypoint command failed with exit code 1, last available logs:\n...",
            )
        }
    )
    message = failure_of(FakeCluster(head))
    assert message.startswith("job eks-ray-train-main-")
    assert "FAILED: Job entrypoint command failed with exit code 1, last available logs:\n" in message
    assert "training failed: Training worker group failed after 0 retries" in message  # driver tail
    assert f"last lines of the job's 8 worker log files on {WORKER_PODS[0]}:" in message
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 3" in message


def test_an_interrupted_update_finds_the_running_job_and_waits_for_it():
    head = main_and_tcp_head()
    fake = FakeCluster(head)
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    head.jobs[base] = replace(
        scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING", "RUNNING", "SUCCEEDED"]
    )
    outs = fake.provider().create(props(run_inputs())).outs
    assert head.submissions == [] and outs["job_id"] == base and outs["transport"] == "efa"
    assert any(f"following job {base} (RUNNING)" in line for line in fake.logged)


def test_a_failed_earlier_attempt_is_retried_under_the_next_id():
    head = main_and_tcp_head()
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    head.jobs[base] = scripted(OOM_JOB, "driver_failed.log", final="FAILED")
    head.jobs[base].looks = 99
    outs = FakeCluster(head).provider().create(props(run_inputs())).outs
    assert outs["job_id"] == f"{base}-2" and len(head.submissions) == 1


def test_a_succeeded_job_that_failed_its_check_is_judged_again_only_while_its_pods_live():
    """The next `pulumi up` re-judges it on the same pods (saying so), and runs a new attempt once a
    worker pod was replaced (a node roll after a security-group fix): the new pods are what is proven."""
    head = FakeRayHead({"main": scripted(FALLBACK_JOB, "driver_tcp.log")})
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    fake = FakeCluster(head)
    first = failure_of(fake)
    assert f"(job {base}," in first and len(head.submissions) == 1 and "note:" not in first

    again = failure_of(fake)
    assert len(head.submissions) == 1 and f"(job {base}," in again
    assert f"note: job {base} SUCCEEDED earlier on these very pods" in again
    assert "replace the worker pods" in again

    rolled = [
        ray_pod(HEAD_POD, "head", node="system-node"),
        ray_pod(WORKER_PODS[0], "worker", uid="a-new-pod-under-the-old-name"),
        ray_pod(WORKER_PODS[1], "worker"),
    ]
    fake.core.pod_snapshots = [rolled]
    fake.core.pod_calls = 0
    head.jobs_by_variant["main"] = scripted(EFA_JOB, "driver_main.log")
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["job_id"] == f"{base}-2" and outs["transport"] == "efa" and len(head.submissions) == 2
    assert any(
        f"job {base} SUCCEEDED earlier on other pods" in line and f"submitting {base}-2" in line
        for line in fake.logged
    )


def test_a_job_that_outlives_the_timeout_is_left_running_for_the_next_update():
    head = FakeRayHead({"main": replace(scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING"])})
    fake = FakeCluster(head)
    message = failure_of(fake, run_inputs(timeout_minutes=2))
    assert "still RUNNING after timeout_minutes=2" in message
    assert "the next `pulumi up` waits for it" in message and "ray job stop eks-ray-train-main-" in message
    assert 120 <= fake.clock.slept <= 130


def test_update_runs_the_job_again_and_delete_removes_nothing():
    fake = FakeCluster(main_and_tcp_head())
    run_provider = fake.provider()
    outs = run_provider.update("id", props(run_inputs()), props(run_inputs(expect_transport="efa"))).outs
    assert outs["transport"] == "efa" and len(fake.head.submissions) == 1
    assert run_provider.read("id", outs).outs == outs
    assert run_provider.delete("id", outs) is None


# --- credentials stay out of the state ---------------------------------------------------------------


def test_the_serialized_provider_holds_no_client_or_secret():
    payload = serialize_provider(provider.TrainingRunProvider())
    loaded = dill.loads(base64.b64decode(payload))
    assert isinstance(loaded, provider.TrainingRunProvider) and loaded._connect is provider.connect_to_eks
    assert len(payload) < 4000  # module references only, not pickled code or clients


def test_configure_takes_the_stack_aws_profile():
    configured = provider.TrainingRunProvider()
    config = pulumi.dynamic.Config({"aws:profile": "ml-team", "aws:region": "us-east-2"}, "eks-ray-train")
    configured.configure(pulumi.dynamic.ConfigureRequest(config))
    assert configured._aws == AwsCredentialSettings(profile="ml-team")


def test_the_resource_registers_only_names_and_settings():
    registered = []

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            registered.append(args)
            return "run-id", {**args.inputs, "transport": "efa"}

        def call(self, args):
            return {}

    pulumi.runtime.set_mocks(Mocks(), project="eks-ray-train", stack="dev", preview=False)
    transports = []

    @pulumi.runtime.test
    def program():
        run = provider.TrainingRun("training", run_inputs())
        return run.transport.apply(transports.append)

    program()
    assert transports == ["efa"]
    (args,) = registered
    assert args.typ == "pulumi-python:dynamic/workloads:TrainingRun"
    assert set(args.inputs) == {*schema.INPUTS, "__provider"}  # the declared outputs are null, so not sent
    text = json.dumps({key: value for key, value in args.inputs.items() if key != "__provider"})
    assert "k8s-aws-v1" not in text and "certificate" not in text.lower() and "token" not in text.lower()


# --- EKS authentication ------------------------------------------------------------------------------


@pytest.fixture
def aws_session(monkeypatch):
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    return boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG",
        region_name="us-east-2",
    )


def decode_token(token: str) -> urllib.parse.ParseResult:
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    body = token[len("k8s-aws-v1.") :]
    return urllib.parse.urlparse(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())


def test_eks_token_is_a_presigned_get_caller_identity_bound_to_the_cluster(aws_session):
    url = decode_token(
        eks_auth.eks_token(aws_session.client("sts", region_name="us-east-2"), "eks-ray-train")
    )
    query = urllib.parse.parse_qs(url.query)
    assert url.hostname == "sts.us-east-2.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"] and query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]


def test_the_api_client_comes_from_describe_cluster_and_refreshes_its_token(aws_session, monkeypatch):
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    eks = aws_session.client("eks", region_name="us-east-2")
    stubber = Stubber(eks)
    stubber.add_response(
        "describe_cluster",
        {
            "cluster": {
                "name": "eks-ray-train",
                "endpoint": "https://ABC.gr7.us-east-2.eks.amazonaws.com",
                "certificateAuthority": {"data": base64.b64encode(ca).decode()},
            }
        },
        {"name": "eks-ray-train"},
    )
    real_client = aws_session.client
    monkeypatch.setattr(
        aws_session, "client", lambda service, **kw: eks if service == "eks" else real_client(service, **kw)
    )
    with stubber, eks_auth.eks_api_client("eks-ray-train", "us-east-2", session=aws_session) as api_client:
        configuration = api_client.configuration
        assert configuration.host == "https://ABC.gr7.us-east-2.eks.amazonaws.com"
        ca_path = Path(configuration.ssl_ca_cert)
        assert ca_path.read_bytes() == ca
        header = configuration.auth_settings()["BearerToken"]["value"]
        assert header.startswith("Bearer k8s-aws-v1.")
    assert not ca_path.exists()


def test_the_token_is_signed_again_once_it_is_old(aws_session):
    clock = FakeClock()
    refresh = eks_auth.token_refresher(aws_session.client("sts", region_name="us-east-2"), "c", clock=clock)
    configuration = k8s.Configuration()
    refresh(configuration)
    first = configuration.api_key["authorization"]
    clock.sleep(eks_auth.REFRESH_AFTER_S - 1)
    refresh(configuration)
    assert configuration.api_key["authorization"] is first
    clock.sleep(2)
    refresh(configuration)
    assert configuration.api_key["authorization"] is not first
    decode_token(configuration.api_key["authorization"])


class FakeExecStream:
    """The parts of `kubernetes.stream.ws_client.WSClient` that `PodExecutor` uses."""

    clock = 0.0  # what `time.monotonic` reads in kube_access while these streams are used

    def __init__(self, stdout: str, stderr: str, status: str, finishes: bool = True):
        self.stdout, self.stderr, self.status, self.finishes = stdout, stderr, status, finishes
        self.closed = False
        self.waits: list[float] = []
        self.close_timeout: float | None = None

    def update(self, timeout):
        """Wait for frames: a command that does not finish sends none, so the wait takes its timeout."""
        self.waits.append(timeout)
        FakeExecStream.clock += timeout

    def is_open(self):
        return not self.finishes

    def read_stdout(self, timeout=None):
        return self.stdout

    def read_stderr(self, timeout=None):
        return self.stderr

    def read_channel(self, channel, timeout=0):
        assert channel == 3  # the exec error channel: the command's exit status
        return self.status

    def close(self, **kwargs):
        self.closed = True
        self.close_timeout = kwargs.get("timeout")


@pytest.fixture
def exec_clock(monkeypatch):
    """kube_access's clock is the fake streams' clock: a stalled command's wait takes no real time."""
    monkeypatch.setattr(FakeExecStream, "clock", 0.0)
    monkeypatch.setattr(kube_access, "time", types.SimpleNamespace(monotonic=lambda: FakeExecStream.clock))


def test_pod_executor_runs_the_command_in_the_first_container(monkeypatch, exec_clock):
    calls = []
    replies = [
        FakeExecStream("42\n", "", '{"status":"Success"}'),
        FakeExecStream(
            "", "boom", '{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}'
        ),
        FakeExecStream("", "", "", finishes=False),
        FakeExecStream("log files: 8\n", "", ""),  # the stream ended without the Status frame
    ]

    def fake_stream(method, name, namespace, **kwargs):
        calls.append((method, name, namespace, kwargs))
        return replies[len(calls) - 1]

    monkeypatch.setattr(kube_access, "stream", fake_stream)
    core = FakeCoreApi([[]], [[ray_pod(HEAD_POD, "head")]])
    core.connect_get_namespaced_pod_exec = object()
    cluster = KubernetesCluster(core, FakeCustomObjects())
    executor = cluster.executor("ray-train", cluster.list_pods("ray-train", "ray.io/node-type=head")[0])
    assert executor.run(["cat", "/opt/eks-ray-train/.code-hash"], 30) == ExecResult(0, "42\n", "")
    method, name, namespace, kwargs = calls[0]
    assert (method, name, namespace) == (core.connect_get_namespaced_pod_exec, HEAD_POD, "ray-train")
    assert kwargs == {
        "container": "ray-head",
        "command": ["cat", "/opt/eks-ray-train/.code-hash"],
        "stdout": True,
        "stderr": True,
        "stdin": False,
        "tty": False,
        "_preload_content": False,
    }
    assert executor.run(["false"], 30) == ExecResult(2, "", "boom")
    with pytest.raises(
        kube_access.CommandTimeout, match=f"`sleep` in pod {HEAD_POD} did not finish within 5 s"
    ):
        executor.run(["sleep", "60"], 5)
    with pytest.raises(errors.ExecStreamCut, match="ended without an exit status after 13 characters"):
        executor.run(["sh", "-c", "grep NCCL"], 30)
    assert all(reply.closed for reply in replies)
    stalled = replies[2]
    assert sum(stalled.waits) == pytest.approx(5) and max(stalled.waits) == kube_access.CANCEL_CHECK_S
    assert stalled.close_timeout == kube_access.CANCEL_CHECK_S  # no 3 s wait for a close frame


def test_an_interrupt_ends_a_running_exec_within_one_check(monkeypatch, exec_clock):
    """`pulumi up` interrupted while a command runs in the pod: the wait ends at the next look."""
    cancelled = threading.Event()
    stream = FakeExecStream("", "", "", finishes=False)
    original_update = stream.update

    def update(timeout):
        original_update(timeout)
        if len(stream.waits) == 3:
            cancelled.set()

    stream.update = update
    monkeypatch.setattr(kube_access, "stream", lambda *args, **kwargs: stream)
    core = types.SimpleNamespace(connect_get_namespaced_pod_exec=object())
    executor = kube_access.PodExecutor(core, "ray-train", HEAD_POD, "ray-head", cancelled=cancelled)
    with pytest.raises(errors.Interrupted, match=f"interrupted while `python` ran in pod {HEAD_POD}"):
        executor.run(["python", "-c", "..."], 120)
    assert len(stream.waits) == 3 and stream.closed


def test_exec_status_comes_from_the_error_channel():
    assert _exec_status('{"metadata":{},"status":"Success"}') == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert _exec_status(json.dumps(failure)) == 3
    assert _exec_status(json.dumps({"status": "Failure", "message": "executable file not found"})) == 126
    assert _exec_status("not a status") == 126


# --- end to end with a real local Ray head -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return children


def _process_tree(root: int) -> set[int]:
    children, tree, todo = _children(), set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def _stop_process_tree(process: subprocess.Popen) -> None:
    """Stop exactly the processes this test started: freeze the tree (nothing new can fork), then kill it.

    Not `ray stop`: that kills every Ray process of the user on the machine, other tests' included.
    """
    frozen: set[int] = set()
    while new := _process_tree(process.pid) - frozen:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


@dataclass
class LocalRay:
    dashboard: str
    session_logs: Path
    env: dict
    root: Path


@pytest.fixture(scope="module")
def local_ray():
    """`ray start --head` with its own ports and temp dir; stopped, with every process it started, afterwards."""
    root = Path(tempfile.mkdtemp(prefix="ray-tr-"))  # short: Ray's unix sockets live under it
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    dashboard_port = _free_port()
    command = [
        "ray",
        "start",
        "--head",
        "--block",
        "--num-cpus=2",
        "--include-dashboard=true",
        f"--dashboard-port={dashboard_port}",
        f"--port={_free_port()}",
        f"--ray-client-server-port={_free_port()}",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--temp-dir={root / 'ray'}",
        "--disable-usage-stats",
    ]
    with open(root / "ray-start.log", "w") as start_log:
        process = subprocess.Popen(
            command, env=env, stdout=start_log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        dashboard = f"http://127.0.0.1:{dashboard_port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{dashboard}/api/version", timeout=2).close()
                break
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "the local Ray head did not start:\n" + (root / "ray-start.log").read_text()[-3000:]
                )
            time.sleep(0.5)
        yield LocalRay(dashboard, root / "ray" / "session_latest" / "logs", env, root)
    finally:
        _stop_process_tree(process)
        shutil.rmtree(root, ignore_errors=True)


def shipped_code(root: Path) -> tuple[Path, str]:
    """The training code as the ConfigMap mount presents it: the package files and `.code-hash`."""
    files = manifests.collect_code(Path(__file__).resolve().parents[1])
    folder = root / "code"
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    (folder / manifests.CODE_HASH_FILE).write_text(manifests.code_hash(files))
    return folder, manifests.code_hash(files)


def local_provider(ray: LocalRay, code_dir: Path, logged: list[str]) -> provider.TrainingRunProvider:
    """The provider, connected to the local head: fake nodes and pods, every pod exec run here."""
    core = FakeCoreApi(
        [[gpu_node("local-node")]], [[ray_pod("local-head", "head"), ray_pod("local-worker", "worker")]]
    )
    local = LocalExecutor(env=ray.env)

    @contextlib.contextmanager
    def connect(inputs, aws, timings):
        yield runner.RunEnvironment(
            KubernetesCluster(core, FakeCustomObjects(worker_replicas=1)),
            executor_for=lambda pod: local,
            dashboard_address=ray.dashboard,
            code_dir=str(code_dir),
            ray_log_dir=str(ray.session_logs),
            nccl_log_dir=str(ray.root),
            log=logged.append,
            poll_interval_s=0.5,
        )

    return provider.TrainingRunProvider(connect=connect)


def ray_jobs(ray: LocalRay) -> list[dict]:
    with urllib.request.urlopen(f"{ray.dashboard}/api/jobs/", timeout=10) as reply:
        return json.load(reply)


@pytest.mark.slow
def test_local_ray_runs_the_tiny_job_reports_it_and_checks_the_transport(local_ray):
    code_dir, code_hash = shipped_code(local_ray.root)
    job_args = (
        "--preset",
        "tiny",
        "--data",
        "synthetic",
        "--steps",
        "3",
        "--workers",
        "2",
        "--no-use-gpu",
        "--checkpoint-every",
        "0",
        "--storage-path",
        str(local_ray.root / "runs"),
    )
    inputs = run_inputs(code_hash=code_hash, job_args=job_args, expect_transport="efa", timeout_minutes=3)
    logged: list[str] = []

    # gloo on CPU prints no NCCL line: the transport is unknown, which no expectation accepts.
    for _ in range(2):  # the second run adopts the finished job and judges its logs anew
        with pytest.raises(errors.TrainingRunError) as caught:
            local_provider(local_ray, code_dir, logged).create(props(inputs))
        message = str(caught.value)
        assert "NCCL used 'unknown' between the nodes, not 'efa'" in message
        assert "no NCCL lines found" in message
        assert (
            "worker log files read: {'local-worker': " in message
        )  # ... though the job's worker logs were read
        assert "{'local-worker': 0}" not in message

    listed = [job for job in ray_jobs(local_ray) if job["submission_id"].startswith("eks-ray-train-main-")]
    assert [job["status"] for job in listed] == ["SUCCEEDED"]
    # Ray kept what the submission attached: the pods it ran on, and where NCCL logs
    assert listed[0]["metadata"][jobs.PODS_METADATA].startswith("local-head=")
    nccl_file = listed[0]["runtime_env"]["env_vars"]["NCCL_DEBUG_FILE"]
    assert nccl_file == f"{local_ray.root}/nccl-{listed[0]['submission_id']}.%h.%p.log"
    assert any("step 3/3" in line for line in logged)
    reported = [
        line for line in logged if f"job {listed[0]['submission_id']}: " in line and "tokens/s" in line
    ]
    assert len(reported) == 2 and "NCCL transport unknown" in reported[0]


@pytest.mark.slow
def test_local_ray_failed_job_fails_with_its_log(local_ray):
    code_dir, code_hash = shipped_code(local_ray.root)
    inputs = run_inputs(code_hash=code_hash, job_args=("--preset", "tiny", "--steps", "0"), timeout_minutes=1)
    with pytest.raises(errors.TrainingRunError) as caught:
        local_provider(local_ray, code_dir, []).create(props(inputs))
    message = str(caught.value)
    assert " FAILED: Job entrypoint command failed with exit code 2" in message
    assert "argument --steps: must be >= 1, got 0" in message


# --- what runs is part of the inputs ----------------------------------------------------------------------


def _registered_run(**settings: str) -> dict:
    from tests.program import ROOT, USER_SETTINGS, run_program, stack_config

    config = {**stack_config(ROOT / "Pulumi.dev.yaml"), **USER_SETTINGS}
    config.update({f"eks-ray-train:{key}": value for key, value in settings.items()})
    return run_program(config).one("pulumi-python:dynamic/workloads:TrainingRun").inputs


@pytest.mark.slow
def test_a_change_of_what_the_pods_run_changes_the_inputs_so_the_job_runs_again():
    """Image, NCCL/EFA environment, resources (all in the rendered RayCluster) and instance type."""
    base = _registered_run()
    image = _registered_run(image="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.2")
    other_gpu = _registered_run(gpuNodeType="g5.12xlarge")
    assert image["run_spec_hash"] != base["run_spec_hash"] and image["code_hash"] == base["code_hash"]
    assert other_gpu["gpu_instance_type"] == "g5.12xlarge" != base["gpu_instance_type"]
    olds = {**base, "job_id": "eks-ray-train-main-0123456789ab"}
    assert provider.diff_props(olds, image).replaces == ["run_spec_hash"]
    assert "gpu_instance_type" in provider.diff_props(olds, other_gpu).replaces


# --- the Ray Jobs client ----------------------------------------------------------------------------------


def test_job_status_mirrors_rays():
    from ray.job_submission import JobStatus as RayJobStatus

    assert {status.value for status in jobs.JobStatus} == {status.value for status in RayJobStatus}
    for status in RayJobStatus:
        assert jobs.JobStatus(status.value).is_terminal == status.is_terminal()


def test_the_head_program_answers_from_the_jobs_rest_api():
    from tests.fake_kube_api import FakeRayDashboard, ScriptedJob
    from workloads.training_run import head_jobs_api

    dashboard = FakeRayDashboard().start()
    try:
        dashboard.jobs["eks-ray-train-main-1"] = ScriptedJob(
            EFA_JOB, "line 1\nline 2\n", ["RUNNING", "SUCCEEDED"], metadata={jobs.PODS_METADATA: PODS_NOW}
        )
        listed = head_jobs_api.answer(dashboard.url, "list", "eks-ray-train-main")
        assert listed == {
            "jobs": [
                {
                    "submission_id": "eks-ray-train-main-1",
                    "job_id": EFA_JOB,
                    "status": "RUNNING",
                    "message": None,
                    "metadata": {jobs.PODS_METADATA: PODS_NOW},
                }
            ]
        }
        first = head_jobs_api.answer(dashboard.url, "poll", "eks-ray-train-main-1", 0)
        assert (first["job"]["status"], first["logs"], first["offset"]) == ("RUNNING", "line 1\n", 7)
        second = head_jobs_api.answer(dashboard.url, "poll", "eks-ray-train-main-1", 7)
        assert (second["job"]["status"], second["logs"]) == ("SUCCEEDED", "line 2\n")
        assert head_jobs_api.answer(dashboard.url, "poll", "other", 0) == {
            "job": None,
            "logs": "",
            "offset": 0,
        }
    finally:
        dashboard.stop()


# --- the stack's AWS identity settings --------------------------------------------------------------------


def test_aws_settings_are_read_as_the_aws_provider_writes_them():
    chain = [
        {"roleArn": "arn:aws:iam::1:role/a"},
        {"roleArn": "arn:aws:iam::2:role/b", "duration": "1h30m", "externalId": "x"},
    ]
    settings = AwsCredentialSettings.from_config(
        {
            "aws:profile": "ml",
            "aws:assumeRoles": json.dumps(chain),
            "aws:assumeRole": {"roleArn": "arn:aws:iam::0:role/z"},
        }
    )
    assert [role.role_arn for role in settings.roles] == [
        "arn:aws:iam::0:role/z",
        "arn:aws:iam::1:role/a",
        "arn:aws:iam::2:role/b",
    ]
    assert settings.roles[2].request() == {
        "RoleSessionName": "eks-ray-train-training-run",
        "RoleArn": "arn:aws:iam::2:role/b",
        "DurationSeconds": 5400,
        "ExternalId": "x",
    }
    assert settings.profile == "ml" and "role arn:aws:iam::2:role/b" in settings.describe()


@pytest.mark.parametrize(
    "config, key, reason",
    [
        (
            {"aws:assumeRoleWithWebIdentity": '{"roleArn": "r"}'},
            "aws:assumeRoleWithWebIdentity",
            "not honoured",
        ),
        (
            {"aws:sharedCredentialsFiles": '["/x"]'},
            "aws:sharedCredentialsFiles",
            "AWS_SHARED_CREDENTIALS_FILE",
        ),
        ({"aws:accessKey": "AKIA"}, "aws:secretKey", "need both"),
        ({"aws:assumeRole": '{"sessionName": "s"}'}, "aws:assumeRole", "needs a roleArn"),
        ({"aws:assumeRole": '{"roleArn": "r", "mfa": 1}'}, "aws:assumeRole", "field(s) mfa not honoured"),
        (
            {"aws:assumeRoles": '[{"roleArn": "r", "duration": "soon"}]'},
            "aws:assumeRoles[0].duration",
            "not like 1h",
        ),
    ],
)
def test_aws_settings_that_cannot_be_honoured_are_refused_naming_the_key(config, key, reason):
    from infra.aws_identity import AwsSettingsError

    with pytest.raises(AwsSettingsError) as caught:
        AwsCredentialSettings.from_config(config)
    assert caught.value.key == key and reason in caught.value.reason


def test_an_unusable_aws_profile_fails_with_one_line_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    settings = AwsCredentialSettings(profile="nope-profile")
    with (
        pytest.raises(errors.TrainingRunError) as caught,
        provider.connect_to_eks(run_inputs(), settings, schema.RunTimings()),
    ):
        pass
    assert str(caught.value) == (
        "the stack's AWS settings (profile nope-profile (aws:profile)) give no usable credentials: "
        "The config profile (nope-profile) could not be found"
    )


def test_run_timings_come_from_the_environment_and_refuse_nonsense():
    timings = schema.RunTimings.from_env(
        {"EKS_RAY_TRAIN_API_ATTEMPTS": "5", "EKS_RAY_TRAIN_POLL_INTERVAL_S": "0.5"}
    )
    assert (timings.api.attempts, timings.poll_interval_s, timings.readiness_timeout_s) == (5, 0.5, 1200)
    with pytest.raises(
        errors.TrainingRunError, match="EKS_RAY_TRAIN_API_READ_TIMEOUT_S='soon': must be a positive"
    ):
        schema.RunTimings.from_env({"EKS_RAY_TRAIN_API_READ_TIMEOUT_S": "soon"})


@pytest.mark.parametrize(
    "data",
    [
        "synthetic",
        "s3://bucket/corpus/",
        "training/corpus",
        "./training/corpus/",
        "training/corpus/bread.txt",
    ],
)
def test_job_data_the_pods_can_read_is_accepted(data):
    args = job_arguments(
        stack_training({"data": data}),
        world_size=8,
        gpus_per_worker=1,
        storage_path="s3://b/r",
        shipped_files=SHIPPED,
    )
    assert args[args.index("--data") + 1] == data


@pytest.mark.parametrize(
    "data", ["/home/me/corpus", "../corpus", "corpus", "training/config.py", "training/nowhere"]
)
def test_job_data_only_this_machine_has_is_refused(data):
    with pytest.raises(
        ConfigError, match=r"config key 'training\.data' = .*: the pods hold only the shipped code"
    ):
        job_arguments(
            stack_training({"data": data}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )


# --- faults: retries and how their causes are told apart ----------------------------------------------


def test_retry_delay_honours_retry_after_within_its_cap_else_backs_off():
    assert kube_access.retry_delay(1, "2") == 2.0
    assert kube_access.retry_delay(1, "3600") == kube_access.RETRY_AFTER_MAX_S
    assert kube_access.retry_delay(1, None) == kube_access.BACKOFF_S
    assert kube_access.retry_delay(2, "Wed, 21 Oct 2015 07:28:00 GMT") == 2 * kube_access.BACKOFF_S
    assert kube_access.retry_delay(10, None) == kube_access.BACKOFF_MAX_S


def _handshake_failure(status: int, message: str, body: bytes, headers: dict) -> ApiException:
    """What kubernetes-client 37 raises for a refused exec (stream/ws_client.py, websocket_call)."""
    try:
        try:
            raise websocket.WebSocketBadStatusException(
                f"Handshake status {status} {message} -+-+- {headers} -+-+- {body!r}",
                status,
                message,
                headers,
                body,
            )
        except Exception as cause:
            raise ApiException(status=0, reason=str(cause))  # noqa: B904 (the client's own wording)
    except ApiException as error:
        return error


def test_a_refused_handshake_gives_its_status_retry_after_and_the_apis_message():
    body = json.dumps({"kind": "Status", "message": "error dialing backend: dial tcp: i/o timeout"}).encode()
    error = _handshake_failure(500, "Internal Server Error", body, {"retry-after": "3"})
    assert kube_access.handshake_refusal(error) == (
        500,
        "3",
        "Internal Server Error error dialing backend: dial tcp: i/o timeout",
    )
    assert (
        kube_access.handshake_refusal(ApiException(status=0, reason="Handshake status 404 Not Found"))[0]
        == 404
    )
    assert (
        kube_access.handshake_refusal(ApiException(status=0, reason="[Errno 111] Connection refused")) is None
    )


def test_a_rest_answer_that_may_pass_is_asked_again_until_the_attempts_are_spent():
    calls = []

    def list_node(label_selector, **_):
        calls.append(label_selector)
        raise ApiException(status=429, reason="Too Many Requests")

    core = types.SimpleNamespace(list_node=list_node)
    cluster = KubernetesCluster(core, None, timeouts=kube_access.ApiTimeouts(attempts=3, backoff_s=0.001))
    with pytest.raises(errors.ApiRefused, match=r"answered 429 to listing nodes.*3 attempts"):
        cluster.list_nodes("role=gpu-worker")
    assert len(calls) == 3 and not cluster.accepted
    cancelled = threading.Event()
    cancelled.set()
    cluster = KubernetesCluster(core, None, cancelled=cancelled)
    with pytest.raises(errors.Interrupted):
        cluster.list_nodes("role=gpu-worker")


@pytest.mark.parametrize(
    ("sts_error", "accepted_before", "cause"),
    [
        ("ExpiredToken", True, "expired"),
        ("ExpiredToken", False, "expired"),
        ("InvalidClientTokenId", False, "invalid"),
        (None, True, "revoked"),
        (None, False, "no-access-entry"),
        ("Throttling", False, "no-access-entry"),
    ],
)
def test_a_401_is_explained_by_what_sts_says_of_the_credentials(sts_error, accepted_before, cause):
    assert provider.unauthorized_cause(sts_error, accepted_before) == cause
