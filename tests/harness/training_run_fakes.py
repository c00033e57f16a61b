"""Fakes, fixture data and helpers shared by the TrainingRun tests.

Three levels, no cloud anywhere:

- pure logic (job arguments, input checks, diff, job identity, log parsing);
- the provider against a fake Kubernetes API: real `kubernetes.client` models served by fake
  `CoreV1Api`/`CustomObjectsApi` objects, a fake head pod that answers the Ray commands by
  replaying driver logs from `tests/fixtures/training_run`, and worker pods whose session log
  folders are fixture folders, read by the very shell commands the provider runs in the pods;
- end to end with a real local Ray head (`ray start --head` here, stopped afterwards): the
  provider's `create`, with its executor swapped from pod exec to local exec, submits the tiny
  CPU training job, waits, reads its logs and reports."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from infra.aws_rules.reservation_window import utc_text
from tests.harness import paths
from tests.harness.fake_efa_sysfs import PROBE_TRAFFIC, FakeEfaSysfs
from tests.harness.fake_kube_api import node, selected
from tests.harness.fake_ray_dashboard import ScriptedJob
from tests.harness.fake_ray_pods import HEALTHY_HOST_LIMITS, write_nccl_log_files
from tests.harness.fake_reader_node import FakeReaderNode
from training.metrics.efa_sysfs import SYSFS_ROOT, counter_lines, parse_counters
from workloads import manifests
from workloads.efa_counter_reader import READER_CONTAINER, READER_LABELS, READER_NAMESPACE
from workloads.training_run import errors, provider, readiness, runner, schema
from workloads.training_run.access import jobs
from workloads.training_run.access.cluster_api import KubernetesCluster
from workloads.training_run.access.commands import ExecResult, LocalExecutor
from workloads.training_run.access.ec2_instances import ec2_launch_times
from workloads.training_run.access.node_group import NodeGroupFacts
from workloads.training_run.verdicts import evidence, fabric

FIXTURES = paths.FIXTURES / "training_run"


POD_LOGS = FIXTURES / "pods"


WORKER_PODS = sorted(path.name for path in POD_LOGS.iterdir())


HEAD_POD = "ray-train-head-9bq5w"


# One worker pod per GPU node, as the RayCluster places them; the EFA counter reader pod of each node.
NODES = ["node-a", "node-b"]
WORKER_NODES = dict(zip(WORKER_PODS, NODES, strict=True))
READER_PODS = {"node-a": "efa-counters-4hx7c", "node-b": "efa-counters-m2q9v"}


CODE_HASH = "5f0c2a9d81e4b7c3"


SPEC_HASH = "7e1f0c2b9a4d8e63"


EFA_JOB, TCP_JOB, FALLBACK_JOB, OOM_JOB = "02000000", "03000000", "01000000", "04000000"
PROBE_JOB, TCP_PROBE_JOB = "05000000", "06000000"


# Each GPU node's EC2 instance (its providerID, as EKS sets it: `aws:///<zone>/<instance id>`) and
# when EC2 launched it (DescribeInstances `LaunchTime`).
INSTANCE_IDS = {
    "node-a": "i-0a1b2c3d4e5f60001",
    "node-b": "i-0a1b2c3d4e5f60002",
    "node-c": "i-0a1b2c3d4e5f60003",
}
LAUNCHED = {
    "i-0a1b2c3d4e5f60001": datetime.datetime(2026, 12, 5, 7, 0, 0, tzinfo=datetime.UTC),
    "i-0a1b2c3d4e5f60002": datetime.datetime(2026, 12, 5, 7, 0, 30, tzinfo=datetime.UTC),
}
# The wall clock of the in-process runs starts at 2026-12-05T09:00:00Z (`FakeClock.wall`).
OUTPUT_TIME = datetime.datetime(2026, 12, 5, 9, 0, 0, tzinfo=datetime.UTC)


def gpu_node(
    name: str,
    gpus: str | None = "4",
    efa: str | None = "1",
    present: bool = True,
    ready: bool = True,
    ready_status: str | None = None,
    ready_since: datetime.datetime | None = None,
):
    """A GPU node as the kubernetes client's model: `fake_kube_api.node`, the one builder of a node,
    read back as the client reads the API server's answer; its instance is `INSTANCE_IDS`'s. Its
    Ready condition: `ready`, or `ready_status` ("Unknown"), last changed at `ready_since`."""
    instance = INSTANCE_IDS.get(name, "i-0f0f0f0f0f0f0f0f0")
    since = ready_since.strftime("%Y-%m-%dT%H:%M:%SZ") if ready_since else None
    return as_model(
        node(
            name,
            gpus,
            efa,
            present,
            ready,
            instance_id=instance,
            ready_status=ready_status,
            ready_since=since,
        ),
        "V1Node",
    )


def as_model(body: dict, model: str):
    """An object as the API server serialises it, deserialised into the kubernetes client's `model`."""
    return k8s.ApiClient().deserialize(json.dumps(body), model, "application/json")


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
    deleted_at: datetime.datetime | None = None,
):
    """A Ray pod as KubeRay creates it: its template's annotations, here the spec hash, carried over;
    the API server gives each pod a UID (one per pod object: `uid` models one created again). A pod
    `deleting` is Terminating; `deleted_at` is its deletionTimestamp (the end of its grace)."""
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
            deletion_timestamp=deleted_at
            or (datetime.datetime(2026, 5, 11, 9, 0, tzinfo=datetime.UTC) if deleting else None),
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


def reader_pod(name: str, node: str, reader: FakeReaderNode):
    """An EFA counter reader pod of the DaemonSet on `node` (`workloads.efa_counter_reader`), with
    the status the kubelet reports now for its container, `reader` (`FakeReaderNode`)."""
    status = reader.pod_status()
    container = status["containerStatuses"][0]
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=READER_NAMESPACE,
            uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            labels=dict(READER_LABELS),
        ),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name=READER_CONTAINER)], node_name=node, host_network=True
        ),
        status=k8s.V1PodStatus(
            phase=status["phase"],
            conditions=[k8s.V1PodCondition(type=c["type"], status=c["status"]) for c in status["conditions"]],
            container_statuses=[
                k8s.V1ContainerStatus(
                    name=READER_CONTAINER,
                    image="ray",
                    image_id="",
                    ready=container["ready"],
                    restart_count=container["restartCount"],
                    state=k8s.V1ContainerState(
                        running=k8s.V1ContainerStateRunning() if "running" in container["state"] else None,
                        waiting=k8s.V1ContainerStateWaiting(reason=container["state"]["waiting"]["reason"])
                        if "waiting" in container["state"]
                        else None,
                    ),
                )
            ],
        ),
    )


def stubbed_ec2(
    launched: dict[str, datetime.datetime] | None = None,
    refused: str | None = None,
    stopped: dict[str, datetime.datetime] | None = None,
):
    """A boto3 EC2 client whose DescribeInstances answers from `launched` (instance id -> LaunchTime),
    checked against EC2's own service model by botocore's `Stubber`: asked by the `instance-id`
    filter, it lists the instances EC2 knows and leaves out any other id (EC2 API reference,
    DescribeInstances, `Filter.N`), so an id missing from `launched` is one EC2 no longer knows.
    `stopped` (id -> when) are terminated, their `StateTransitionReason` as EC2 writes it,
    `User initiated (YYYY-MM-DD HH:MM:SS GMT)`. `refused` is an error code EC2 answers instead
    (UnauthorizedOperation, HTTP 403, for an identity without ec2:DescribeInstances: EC2 API
    reference, "Error codes"). Each call is answered once; `stubbed_ec2` stubs one call."""
    import boto3
    from botocore.stub import ANY, Stubber

    ec2 = boto3.client(
        "ec2", region_name="us-east-2", aws_access_key_id="AKIAFAKE", aws_secret_access_key="fake"
    )
    stubber = Stubber(ec2)
    launched = LAUNCHED if launched is None else launched
    stopped = stopped or {}
    asked = {"Filters": [{"Name": "instance-id", "Values": ANY}]}
    if refused:
        stubber.add_client_error(
            "describe_instances",
            service_error_code=refused,
            service_message="You are not authorized to perform this operation.",
            http_status_code=403,
            expected_params=asked,
        )
    else:
        instances = [
            {
                "InstanceId": instance,
                "InstanceType": "g6.12xlarge",
                "LaunchTime": at,
                "State": {"Code": 48, "Name": "terminated"}
                if instance in stopped
                else {"Code": 16, "Name": "running"},
                "StateTransitionReason": f"User initiated ({stopped[instance]:%Y-%m-%d %H:%M:%S} GMT)"
                if instance in stopped
                else "",
            }
            for instance, at in launched.items()
        ]
        stubber.add_response(
            "describe_instances",
            {
                "Reservations": [
                    {"ReservationId": "r-0fake", "OwnerId": "123456789012", "Instances": instances}
                ]
            },
            asked,
        )
    stubber.activate()
    return ec2


class FakeCoreApi:
    """The `CoreV1Api` calls the provider makes; `node_snapshots` are served one per call, the last
    repeats; the EFA counter reader pods (`readers`: pod name, node, its container on the node, in
    their own namespace) are served with the status their containers give now (`reader_pod`).
    `listed` counts the pod listings by label selector.

    The follower's two writes act on every snapshot, as the API server's on its one state (the
    semantics `fake_kube_api` models, its docstring): `patch_node` merges `spec.unschedulable`
    (`patches`: name, body, content type); `delete_namespaced_pod` (`deletions`: namespace, name,
    grace asked) removes a pod at grace 0, else stamps its deletionTimestamp `wall() + grace` and
    hands it to `deleted`, the test's kubelet. Either answers 404 for what is not there."""

    def __init__(self, node_snapshots, pod_snapshots, events=(), readers=()):
        self.node_snapshots = list(node_snapshots)
        self.pod_snapshots = list(pod_snapshots)
        self.events = list(events)
        self.readers = list(readers)
        self.node_calls = 0
        self.pod_calls = 0
        self.listed: Counter[str] = Counter()
        self.patches: list[tuple[str, dict, str | None]] = []
        self.deletions: list[tuple[str, str, int | None]] = []
        self.deleted: Callable[[object, int], None] | None = None
        self.wall: Callable[[], float] = lambda: WALL_START

    def patch_node(self, name, body, _content_type=None, **_request_options):
        self.patches.append((name, body, _content_type))
        assert _content_type in ("application/strategic-merge-patch+json", "application/merge-patch+json")
        found = [n for nodes in self.node_snapshots for n in nodes if n.metadata.name == name]
        if not found:
            raise ApiException(status=404, reason="Not Found")
        for each in found:
            each.spec.unschedulable = body["spec"]["unschedulable"]
        return found[0]

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None, **_request_options):
        self.deletions.append((namespace, name, grace_period_seconds))
        matches = [
            (pods, p)
            for pods in self.pod_snapshots
            for p in pods
            if p.metadata.name == name and p.metadata.namespace == namespace
        ]
        if not matches:
            raise ApiException(status=404, reason="Not Found")
        grace = 30 if grace_period_seconds is None else grace_period_seconds
        for pods, pod in matches:
            if grace == 0:
                pods.remove(pod)
            elif pod.metadata.deletion_timestamp is None:
                pod.metadata.deletion_timestamp = datetime.datetime.fromtimestamp(
                    self.wall() + grace, datetime.UTC
                )
        if grace and self.deleted is not None:
            self.deleted(matches[0][1], grace)
        return matches[0][1]

    def list_node(self, label_selector, **_request_options):
        nodes = self.node_snapshots[min(self.node_calls, len(self.node_snapshots) - 1)]
        self.node_calls += 1
        return k8s.V1NodeList(items=[n for n in nodes if selected(n.metadata.labels, label_selector)])

    def list_namespaced_pod(self, namespace, label_selector, **_request_options):
        if namespace == READER_NAMESPACE:
            pods = [reader_pod(name, node, reader) for name, node, reader in self.readers]
            return k8s.V1PodList(items=[p for p in pods if selected(p.metadata.labels, label_selector)])
        pods = self.pod_snapshots[
            min(self.pod_calls // 2, len(self.pod_snapshots) - 1)
        ]  # head + workers per wait
        self.pod_calls += 1
        self.listed[label_selector] += 1
        return k8s.V1PodList(
            items=[
                p
                for p in pods
                if p.metadata.namespace == namespace and selected(p.metadata.labels, label_selector)
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


class FakeRayHead:
    """The head pod: answers `cat .code-hash`, `ray job submit` and the Jobs API script like a Ray head would."""

    def __init__(
        self,
        jobs_by_variant: dict[str, ScriptedJob],
        code_hashes=(CODE_HASH,),
        probes_by_variant: dict[str, ScriptedJob] | None = None,
    ):
        self.jobs_by_variant = jobs_by_variant
        self.code_hashes = list(code_hashes)
        self.jobs: dict[str, ScriptedJob] = {}
        self.metadata: dict[str, dict] = {}  # what `--metadata-json` attached, per submission id
        self.submissions: list[list[str]] = []
        self.efa: dict[str, FakeEfaSysfs] = {}  # node -> its EFA sysfs, set by FakeCluster
        # The head pod's emptyDir `/tmp/ray`, where the TrainingRun keeps its records of each job.
        self._tmp_ray = tempfile.TemporaryDirectory(prefix="head-tmp-ray-")
        # The worker pods now (FakeCluster's, which a test may swap), for the NCCL log files.
        self.workers: Callable[[], Iterable[FixturePod]] = list
        # The gate's fabric probe before each job, by variant; its submissions are kept apart.
        self.probes_by_variant = probes_by_variant or {
            "main": probe_job(),
            "tcp": scripted(TCP_PROBE_JOB, "driver_probe_tcp.log", nccl_lines_of=TCP_JOB),  # no EFA traffic
        }
        self.probe_submissions: list[list[str]] = []
        # Told each poll of a job, after it: (submission id, the job); a test's fault comes in here.
        self.polled: Callable[[str, ScriptedJob], None] = lambda submission_id, job: None

    def forget(self) -> None:
        """A new head: Ray's job history and the TrainingRun's records (its emptyDir) start empty."""
        self.jobs.clear()
        self.metadata.clear()
        self._tmp_ray = tempfile.TemporaryDirectory(prefix="head-tmp-ray-")

    def run(self, argv, timeout_s):
        if argv[0] == "cat":
            assert argv[1] == f"{manifests.CODE_MOUNT}/{manifests.CODE_HASH_FILE}"
            seen = self.code_hashes.pop(0) if len(self.code_hashes) > 1 else self.code_hashes[0]
            return ExecResult(0, seen + "\n")
        if argv[0] == "sh":  # the TrainingRun's record of a job, in the head pod's /tmp/ray
            return LocalExecutor().run(
                [arg.replace(f"{jobs.NCCL_LOG_DIR}/", f"{self._tmp_ray.name}/") for arg in argv], timeout_s
            )
        if argv[:3] == ["ray", "job", "submit"]:
            assert argv[argv.index("--address") + 1] == jobs.DASHBOARD_ADDRESS
            submission_id = argv[argv.index("--submission-id") + 1]
            if submission_id in self.jobs:
                return ExecResult(1, "", f"Job with submission_id {submission_id} already exists.")
            env = {}
            if "--runtime-env-json" in argv:
                env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
            variant = "tcp" if env.get("NCCL_NET") == "Socket" else "main"
            probe = fabric.PROBE_MODULE in argv
            chosen = self.probes_by_variant if probe else self.jobs_by_variant
            self.jobs[submission_id] = chosen[variant]
            job = self.jobs[submission_id]
            for sysfs in self.efa.values():
                sysfs.add(job.efa_traffic)
            if job.nccl_lines_of is not None:  # the fixture's session logs hold the lines
                for pod in self.workers():
                    write_nccl_log_files(
                        POD_LOGS / pod.name / "logs",
                        pod.nccl_logs,
                        pod.name,
                        submission_id,
                        job.nccl_lines_of,
                    )
            if "--metadata-json" in argv:
                self.metadata[submission_id] = json.loads(argv[argv.index("--metadata-json") + 1])
            (self.probe_submissions if probe else self.submissions).append(list(argv))
            return ExecResult(0, f"Job '{submission_id}' submitted successfully\n")
        if argv[:3] == ["python", "-c", jobs.HEAD_JOBS_API_SOURCE]:
            action, subject = argv[4], argv[5]
            if action == "list":
                listed = [
                    {
                        "submission_id": sid,
                        "job_id": job.job_id(),
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
            self.polled(subject, job)
            offset = int(argv[6])
            record = {
                "submission_id": subject,
                "job_id": job.job_id(),
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
    (the emptyDir `/tmp/ray`) is `nccl_logs`, an empty folder of its own unless given (the fixtures
    hold no NCCL log files: their jobs were submitted before they existed); commands really run, here.
    Its `/sys/class/infiniband` is its node's (`efa`) as a pod network namespace shows it: compat
    devices without counters (`FakeEfaSysfs.pod_view`)."""

    def __init__(
        self,
        name: str,
        logs: Path | None = None,
        nccl_logs: Path | None = None,
        efa: FakeEfaSysfs | None = None,
    ):
        self.name = name
        self.logs = logs or POD_LOGS / name / "logs"
        if nccl_logs is None:
            self._own = tempfile.TemporaryDirectory(prefix="tmp-ray-")
            nccl_logs = Path(self._own.name)
        self.nccl_logs = nccl_logs
        self.nccl_logs.mkdir(parents=True, exist_ok=True)
        self.efa = efa
        self.host_limits = HEALTHY_HOST_LIMITS  # what its node gives it, as `fake_ray_pods` models it
        stamp_write_order(self.logs)
        self.commands: list[list[str]] = []

    def run(self, argv, timeout_s):
        self.commands.append(list(argv))
        if argv == readiness.host_limits_command():
            return ExecResult(0, self.host_limits)
        local = {evidence.RAY_LOG_DIR: str(self.logs), jobs.NCCL_LOG_DIR: str(self.nccl_logs)}
        if self.efa is not None:
            local[SYSFS_ROOT] = str(self.efa.pod_view)
        return LocalExecutor().run([local.get(arg, arg) for arg in argv], timeout_s)


class GonePod:
    """A pod the API server no longer has: an exec into it is refused 404, which `pod_exec` raises
    as `PodGone` (`fake_kube_api` answers `pods "<name>" not found`)."""

    def __init__(self, name: str):
        self.name = name

    def run(self, argv, timeout_s):
        raise errors.PodGone(
            self.name, f"exec of `{argv[0]}` in pod {self.name}", f'pods "{self.name}" not found'
        )


class HeadPod:
    """An exec into a head pod, looked up when it runs: the head's (`FakeRayHead`) while the pod is
    the head, refused 404 once it was replaced (`FakeCluster.replace_head`)."""

    def __init__(self, cluster: FakeCluster, name: str):
        self.cluster, self.name = cluster, name

    def run(self, argv, timeout_s):
        if self.name != self.cluster.head_pod:
            return GonePod(self.name).run(argv, timeout_s)
        return self.cluster.head.run(argv, timeout_s)


class ReaderPod:
    """An EFA counter reader pod (`hostNetwork`): its sysfs is the host's view of its node's,
    counters included; its `python` is this one, as the Ray image's would be. An exec into it while
    its container (`reader`) is not running is refused as the API server refuses it (`FakeKubeApi._exec`)."""

    def __init__(self, efa: FakeEfaSysfs, reader: FakeReaderNode):
        self.efa = efa
        self.reader = reader
        self.commands: list[list[str]] = []

    def run(self, argv, timeout_s):
        self.commands.append(list(argv))
        assert argv[:2] == ["python", "-c"], argv
        if not self.reader.running:
            raise errors.ApiRefused(500, "exec", f'container not found ("{READER_CONTAINER}")')
        local = [sys.executable, *(str(self.efa.root) if arg == SYSFS_ROOT else arg for arg in argv[1:])]
        return LocalExecutor().run(local, timeout_s)


# The wall time (seconds since the epoch) at which a `FakeClock` starts: 2026-12-05T09:00:00Z.
WALL_START = OUTPUT_TIME.timestamp()


class FakeClock:
    """Time that passes only when the provider sleeps; `wall` is the same time since the epoch."""

    def __init__(self):
        self.now = 0.0
        self.slept = 0.0

    def __call__(self):
        return self.now

    def wall(self):
        return WALL_START + self.now

    def sleep(self, seconds):
        self.now += seconds
        self.slept += seconds


def driver_log(name: str) -> str:
    return (FIXTURES / name).read_text()


def rank0_line(text: str) -> str:
    """A line rank 0 of the job prints, as Ray relays it to the driver's log: behind its worker's
    tag (the fixtures' rank 0, `driver_main.log`)."""
    return f"\x1b[36m(RayTrainWorker pid=4700, ip=10.0.3.17)\x1b[0m {text}\n"


def driver_log_with(log: str, after: str, lines: Iterable[str]) -> str:
    """The driver log `log` with `lines` after its first line that holds `after`."""
    kept = log.splitlines(keepends=True)
    index = next(i for i, line in enumerate(kept) if after in line)
    return "".join([*kept[: index + 1], *lines, *kept[index + 1 :]])


# What the EFA job's traffic adds to each worker node's counters: a smoke run's FSDP collectives.
EFA_JOB_TRAFFIC = {
    "tx_bytes": 12_884_901_888,
    "rx_bytes": 12_884_905_984,
    "tx_pkts": 1_536_000,
    "rx_pkts": 1_536_004,
    "rdma_read_bytes": 12_884_901_888,
    "retrans_pkts": 2,
}


# A restart as the job's run summary reports it (`workloads.training_run.attempts.ATTEMPT_KEYS`): the
# worker pod on the second GPU node lost at step 3, resumed from the checkpoint of step 2.
LOST_WORKER_ATTEMPT = {
    "attempt": 1,
    "cause": "worker on ray-train-gpu-workers-worker-b died: ActorDiedError (the pod was deleted)",
    "node": "ray-train-gpu-workers-worker-b",
    "failed_after_step": 3,
    "resumed_from_step": 2,
    "lost_steps": 1,
    "recovery_s": 41.5,
}


def with_restarts(log: str, attempts: list[dict]) -> str:
    """A driver log whose run summary (its JSON line with `world_size`) also reports `attempts`."""
    lines = log.splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.startswith('{"world_size"')]
    summary = {**json.loads(lines[index]), "restarts": len(attempts), "attempts": attempts}
    lines[index] = json.dumps(summary) + "\n"
    return "".join(lines)


def scripted(
    ray_job_id: str,
    log_name: str,
    final: str = "SUCCEEDED",
    message: str | None = None,
    efa_traffic: dict[str, int] | None = None,
    nccl_lines_of: str | None = None,
):
    return ScriptedJob(
        ray_job_id,
        driver_log(log_name),
        ["PENDING", "RUNNING", "RUNNING", final],
        message,
        efa_traffic=dict(efa_traffic or {}),
        nccl_lines_of=nccl_lines_of,
    )


def probe_job(nccl_lines_of: str = EFA_JOB, efa_traffic: dict[str, int] | None = None) -> ScriptedJob:
    """The gate's probe over EFA: NCCL log files with the EFA run's lines, EFA traffic on every node;
    `nccl_lines_of=FALLBACK_JOB` is one whose aws-ofi-nccl failed, so NCCL fell back to sockets."""
    traffic = PROBE_TRAFFIC if efa_traffic is None else efa_traffic
    return scripted(PROBE_JOB, "driver_probe.log", efa_traffic=traffic, nccl_lines_of=nccl_lines_of)


# The epoch second the fake clock's 0 stands for, when the fake EKS stamps an update (2027-01-15 08:00 UTC).
FAKE_EPOCH = 1_800_000_000


class FakeNodeGroupSizer:
    """The GPU node group as `EksNodeGroup` reads and resizes it, in process (`fake_aws_endpoints.FakeNodeGroup`
    models EKS's side over HTTP, nodes included); each resize is recorded and stamped at the fake clock."""

    def __init__(
        self, clock: FakeClock, desired: int = 2, status: str = "ACTIVE", issues: tuple[str, ...] = ()
    ):
        self.clock, self.desired, self.status, self.issues = clock, desired, status, issues
        self.sizes: list[int] = []

    def describe(self) -> NodeGroupFacts:
        return NodeGroupFacts("gpu-0a1b2c3", self.status, self.desired, self.issues)

    def set_desired_size(self, size: int) -> str:
        self.sizes.append(size)
        self.desired = size
        return utc_text(datetime.datetime.fromtimestamp(FAKE_EPOCH + self.clock.now, datetime.UTC))


@dataclass
class FakeCluster:
    """A whole fake cluster: nodes, pods, events, head, workers, clock, the GPU node group (with
    `release`), and the Pulumi log lines."""

    head: FakeRayHead
    nodes: list = field(default_factory=lambda: [gpu_node("node-a"), gpu_node("node-b")])
    node_snapshots: list | None = None
    pod_snapshots: list | None = None
    events: list = field(default_factory=list)
    worker_replicas: int | None = 2
    clock: FakeClock = field(default_factory=FakeClock)
    logged: list[str] = field(default_factory=list)
    node_group: FakeNodeGroupSizer | None = None
    # EC2's answer to DescribeInstances for the GPU nodes: their launch times, those terminated and
    # when, or a refusal's code.
    launched: dict[str, datetime.datetime] = field(default_factory=lambda: dict(LAUNCHED))
    ec2_refused: str | None = None
    stopped: dict[str, datetime.datetime] = field(default_factory=dict)

    def __post_init__(self):
        self.node_group = self.node_group or FakeNodeGroupSizer(self.clock)
        pods = [
            ray_pod(HEAD_POD, "head", node="system-node"),
            *(ray_pod(name, "worker", node=WORKER_NODES[name]) for name in WORKER_PODS),
        ]
        self._pods = tempfile.TemporaryDirectory(prefix="worker-pods-")
        folder = Path(self._pods.name)
        self.head.efa = {node: FakeEfaSysfs(folder / "sysfs" / node) for node in NODES}
        self.reader_nodes = {node: FakeReaderNode(self.head.efa[node].root) for node in NODES}
        self.core = FakeCoreApi(
            self.node_snapshots or [self.nodes],
            self.pod_snapshots or [pods],
            self.events,
            [(READER_PODS[node], node, self.reader_nodes[node]) for node in NODES],
        )
        self.workers = {
            name: FixturePod(name, nccl_logs=folder / "tmp-ray" / name, efa=self.head.efa[WORKER_NODES[name]])
            for name in WORKER_PODS
        }
        self.readers = {
            READER_PODS[node]: ReaderPod(self.head.efa[node], self.reader_nodes[node]) for node in NODES
        }
        self.head.workers = lambda: self.workers.values()
        self.core.wall = self.clock.wall
        self.head_pod = HEAD_POD  # the head pod's name now (`replace_head`)
        self.former_heads: set[str] = set()

    def replace_head(self, new_name: str) -> None:
        """The head pod gone and KubeRay's new one Ready in its place: an exec into the old one answers
        404, every pod listing holds the new one, and Ray on it starts without job history."""
        for pods in self.core.pod_snapshots:
            for index, pod in enumerate(pods):
                if pod.metadata.name == self.head_pod:
                    pods[index] = ray_pod(new_name, "head", node="system-node")
        self.former_heads.add(self.head_pod)
        self.head_pod = new_name
        self.head.forget()

    def record_counters_before(self, submission_id: str) -> None:
        """What the run records beside a job before it submits it: each worker node's counters now,
        as its reader prints them (for a job a test puts on the head as an earlier run's)."""
        before = {
            pod: parse_counters(counter_lines(str(self.head.efa[node].root)))
            for pod, node in WORKER_NODES.items()
        }
        jobs.RayJobsClient(self.head).write_record(submission_id, {"efa_before": before})

    def executor(self, pod):
        if pod.name == self.head_pod or pod.name in self.former_heads:
            return HeadPod(self, pod.name)
        return self.readers[pod.name] if pod.namespace == READER_NAMESPACE else self.workers[pod.name]

    def environment(self) -> runner.RunEnvironment:
        cluster = KubernetesCluster(self.core, FakeCustomObjects(self.worker_replicas))
        return runner.RunEnvironment(
            cluster,
            executor_for=self.executor,
            log=self.logged.append,
            clock=self.clock,
            sleep=self.clock.sleep,
            node_group=self.node_group,
            launch_times=ec2_launch_times(
                stubbed_ec2(self.launched, self.ec2_refused, self.stopped), "the ambient AWS credentials"
            ),
            wall_clock=self.clock.wall,
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
        "line_rate_gbps": 40.0,  # g6.12xlarge's NetworkPerformance, "40 Gigabit"
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
            "main": replace(
                scripted(EFA_JOB, "driver_main.log", efa_traffic=EFA_JOB_TRAFFIC), **main_changes
            ),
            "tcp": scripted(TCP_JOB, "driver_tcp.log"),
        }
    )


def failure_of(fake: FakeCluster, inputs: schema.RunInputs | None = None) -> str:
    with pytest.raises(errors.TrainingRunError) as caught:
        fake.provider().create(props(inputs or run_inputs()))
    return str(caught.value)
