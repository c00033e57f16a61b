"""TrainingRun: the post-deploy step that runs the training job and proves NCCL's transport.

Pods starting proves nothing: without the EFA device NCCL silently falls back to TCP sockets and
the job still completes, only slower. So after the RayCluster exists, `pulumi up` creates this
dynamic resource, whose provider:

1. checks every GPU node (`role=gpu-worker`) advertises allocatable `nvidia.com/gpu` equal to the
   GPUs per node, `vpc.amazonaws.com/efa` of at least the EFA interfaces per node, and carries
   `nvidia.com/gpu.present=true`, waiting while the device plugins register; it fails naming
   the node and what is missing;
2. waits (bounded) for the head pod and every worker pod of the RayCluster to be Ready, and on
   timeout fails with each pod's phase, container problems and latest events;
3. waits until the head pod sees the code being deployed (`.code-hash` in the ConfigMap mount,
   which the kubelet refreshes lazily), then execs `ray job submit --address
   http://localhost:8265 ... -- python -m training ...` inside the head pod through the API
   server's exec stream (the dashboard is never exposed);
4. follows the job through the Jobs REST API from inside the head pod, logging each step
   (loss, tokens/s, MFU) to the Pulumi log;
5. greps the NCCL lines of that job out of each worker pod's Ray session logs, adds those the
   driver relayed, and classifies them (`workloads.nccl_transport`);
6. fails `pulumi up` with the evidence when the transport is not the expected one (`efa`);
7. outputs the job id, status, transport, evidence, tokens/s, MFU, step time and duration.

With `benchmark` it then runs the same job with NCCL forced onto TCP (`TCP_BASELINE_ENV`),
checks that run really used sockets, and outputs both throughputs and their ratio.

Job identity. A job's submission id is derived from what makes the job what it is (cluster,
namespace, RayCluster, code hash, job arguments, transport variant), so a `pulumi up`
interrupted while the job runs is followed by one that finds the job and waits for it instead
of starting a second one. A job with that id that already succeeded is reported again without
retraining (changing only `expect_transport` re-judges the same logs); one that failed or was
stopped is retried under `<id>-2`, `<id>-3`, ... A timed-out wait leaves the job running for
the next `pulumi up` to pick up. Ray keeps job history while the head pod lives; a new head
means a new run. To force a fresh run of identical inputs, `ray job delete <job id>` in the head.

Re-runs. `diff` replaces the resource, which runs the job (again), when any input in
`RERUN_INPUTS` changes: the code hash, the job arguments, `benchmark`, the expected transport or
where the job runs; a change of `timeout_minutes` alone is a no-op. `update` (reached only when
the engine asks for it) runs the job as `create` does. `delete` does nothing: a finished job
holds no resources, and its history goes with the RayCluster.

Credentials. The provider is serialized into the state with dill; it holds no client and no
secret. Inputs are the cluster name and region; inside `create` the provider builds its
Kubernetes client from them (`workloads.eks_auth`) with the ambient AWS credentials (and the
stack's `aws:profile`, if set). Neither a token nor a kubeconfig reaches inputs or outputs.

Progress. The Python dynamic provider runs without an engine connection, so `pulumi.log.info`
falls back to writing `info: ...` on the provider's stderr, which the Pulumi CLI shows as
diagnostics of the update (not attached to this resource).

Limits of the NCCL evidence: worker logs are matched to the job by Ray's job id in the file name
(`worker-<worker id>-<job id>-<pid>.out|err` under `/tmp/ray/session_latest/logs`), which
covers the Ray Train workers; a worker pod restarted since the job ran has lost its logs, and
the driver's relayed copy (deduplicated by Ray) then stands in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import kubernetes.client
import pulumi
import pulumi.dynamic
from pulumi.runtime import rpc

from infra.config import ConfigError, TrainingSettings
from training.report import format_progress_line, parse_step_line, parse_summary
from workloads import manifests
from workloads.eks_auth import eks_api_client
from workloads.kube_access import ClusterApi, CommandTimeout, Executor, KubernetesCluster, NodeFacts, PodFacts
from workloads.nccl_transport import TRANSPORTS, Verdict, classify_lines

DASHBOARD_ADDRESS = "http://localhost:8265"
RAY_LOG_DIR = "/tmp/ray/session_latest/logs"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_NODE_LABEL_SELECTOR = ",".join(f"{key}={value}" for key, value in manifests.GPU_NODE_SELECTOR.items())

# The TCP baseline of the benchmark: the reference's settings (NCCL's own socket transport, the
# OFI plugin not loaded) plus explicit socket parallelism. In a VPC-CNI pod NCCL cannot tell
# it runs on AWS (eth0 is a veth), keeps its default of one thread with one socket, and a
# single TCP stream cannot fill the 40 Gbps link: 4 x 4 sockets make the comparison fair.
TCP_BASELINE_ENV = {
    "NCCL_NET": "Socket",
    "NCCL_NET_PLUGIN": "none",
    "FI_PROVIDER": "tcp",
    "NCCL_SOCKET_NTHREADS": "4",
    "NCCL_NSOCKS_PERTHREAD": "4",
}
MAIN_VARIANT, TCP_VARIANT = "main", "tcp"

INPUTS = (
    "cluster_name",
    "region",
    "namespace",
    "ray_cluster_name",
    "gpus_per_node",
    "efa_per_node",
    "code_hash",
    "job_args",
    "expect_transport",
    "benchmark",
    "timeout_minutes",
)
RERUN_INPUTS = tuple(key for key in INPUTS if key != "timeout_minutes")
OUTPUTS = (
    "job_id",
    "status",
    "transport",
    "transport_reason",
    "evidence",
    "worker_log_files",
    "tokens_per_s",
    "mfu",
    "step_time_s",
    "duration_s",
    "summary",
    "tcp_job_id",
    "tcp_transport",
    "tcp_evidence",
    "tcp_tokens_per_s",
    "efa_speedup",
)

JOB_ID_PREFIX = "eks-ray-train"
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
ADOPTABLE_STATES = frozenset({"PENDING", "RUNNING", "SUCCEEDED"})
COMMAND_TIMEOUT_S = 120
SUBMIT_TIMEOUT_S = 600  # `ray job submit` zips and uploads the working directory first
NCCL_LINES_PER_POD = 200_000
LOG_TAIL_LINES = 40


class TrainingRunError(Exception):
    """The training run cannot go on; the message says what was found and what to check."""


# --- the stack's training settings as `python -m training` flags ------------------------------


def job_arguments(
    training: TrainingSettings, world_size: int, gpus_per_worker: int, storage_path: str
) -> list[str]:
    """Flags of `python -m training` for the stack's `training` settings.

    `world_size` is the number of training workers the GPU nodes hold (their GPUs divided by
    `gpus_per_worker`); `training.workers` may ask for fewer. `hsdp` maps to `--hsdp-replicas
    auto` (shard inside a node, replicate across) or 1 (plain FSDP), so the stack setting wins
    over the preset's default. Unset optional settings leave the preset's value.
    """
    workers = training.workers or world_size
    if workers > world_size:
        raise ConfigError(
            f"config key 'training.workers' = {workers}: the GPU nodes hold {world_size} workers of "
            f"{gpus_per_worker} GPU each; set training.workers to {world_size} or less, or add GPU nodes"
        )
    args = [
        "--preset",
        training.preset,
        "--model-id",
        training.model_id,
        "--init",
        training.init,
        "--workers",
        str(workers),
        "--use-gpu",
        "--gpus-per-worker",
        str(gpus_per_worker),
        "--hsdp-replicas",
        "auto" if training.hsdp else "1",
        "--storage-path",
        storage_path,
    ]
    optional = (
        ("--steps", training.steps),
        ("--seq-len", training.seq_len),
        ("--batch-size", training.batch_size),
        ("--lr", training.learning_rate),
        ("--checkpoint-every", training.checkpoint_every),
    )
    for flag, value in optional:
        if value is not None:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return args


# --- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInputs:
    """The resource's inputs, typed (Pulumi hands numbers over as floats)."""

    cluster_name: str
    region: str
    namespace: str
    ray_cluster_name: str
    gpus_per_node: int
    efa_per_node: int
    code_hash: str
    job_args: tuple[str, ...]
    expect_transport: str = "efa"
    benchmark: bool = False
    timeout_minutes: int = 60

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> RunInputs:
        return cls(
            cluster_name=props["cluster_name"],
            region=props["region"],
            namespace=props["namespace"],
            ray_cluster_name=props["ray_cluster_name"],
            gpus_per_node=int(props["gpus_per_node"]),
            efa_per_node=int(props["efa_per_node"]),
            code_hash=props["code_hash"],
            job_args=tuple(props["job_args"]),
            expect_transport=props["expect_transport"],
            benchmark=bool(props["benchmark"]),
            timeout_minutes=int(props["timeout_minutes"]),
        )

    def props(self) -> dict[str, Any]:
        values = {key: getattr(self, key) for key in INPUTS}
        values["job_args"] = list(self.job_args)
        return values


def _is_count(value: Any, minimum: int) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == int(value)
        and value >= minimum
    )


def input_problems(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(input, reason) for each input that cannot work; unknown values (preview) pass."""
    problems = [(key, "is required") for key in INPUTS if props.get(key) is None]

    def known(key: str) -> bool:
        return props.get(key) is not None and props[key] != rpc.UNKNOWN

    for key in ("cluster_name", "region", "namespace", "ray_cluster_name", "code_hash"):
        if known(key) and not (isinstance(props[key], str) and props[key]):
            problems.append((key, "must be a non-empty string"))
    if known("gpus_per_node") and not _is_count(props["gpus_per_node"], 1):
        problems.append(("gpus_per_node", "must be a whole number of at least 1"))
    if known("efa_per_node") and not _is_count(props["efa_per_node"], 0):
        problems.append(("efa_per_node", "must be a whole number, 0 or more"))
    if known("job_args") and not (
        isinstance(props["job_args"], list) and all(isinstance(arg, str) for arg in props["job_args"])
    ):
        problems.append(("job_args", "must be a list of strings (flags of `python -m training`)"))
    if known("expect_transport") and props["expect_transport"] not in TRANSPORTS:
        problems.append(("expect_transport", f"must be one of {', '.join(TRANSPORTS)}"))
    if (
        known("expect_transport")
        and props["expect_transport"] == "efa"
        and known("efa_per_node")
        and _is_count(props["efa_per_node"], 0)
        and props["efa_per_node"] < 1
    ):
        problems.append(
            ("efa_per_node", "expecting the efa transport needs at least 1 EFA interface per node")
        )
    if known("benchmark") and not isinstance(props["benchmark"], bool):
        problems.append(("benchmark", "must be true or false"))
    if known("timeout_minutes") and not _is_count(props["timeout_minutes"], 1):
        problems.append(("timeout_minutes", "must be a whole number of at least 1"))
    return problems


def diff_props(olds: Mapping[str, Any], news: Mapping[str, Any]) -> pulumi.dynamic.DiffResult:
    """Replace (run again) when an input of `RERUN_INPUTS` changed; one not known yet differs too."""
    changed = [key for key in RERUN_INPUTS if olds.get(key) != news.get(key)]
    return pulumi.dynamic.DiffResult(
        changes=bool(changed), replaces=changed, stables=[], delete_before_replace=False
    )


# --- job identity -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    """One Ray job as the Jobs API reports it."""

    submission_id: str
    status: str
    ray_job_id: str | None = None
    message: str | None = None


def submission_id_base(inputs: RunInputs, variant: str, env_vars: Mapping[str, str]) -> str:
    """Stable id of the job these inputs run: same inputs, same id, on any `pulumi up`."""
    identity = {
        "cluster_name": inputs.cluster_name,
        "region": inputs.region,
        "namespace": inputs.namespace,
        "ray_cluster_name": inputs.ray_cluster_name,
        "code_hash": inputs.code_hash,
        "job_args": list(inputs.job_args),
        "env_vars": dict(env_vars),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{JOB_ID_PREFIX}-{variant}-{digest}"


def _attempt(submission_id: str, base: str) -> int | None:
    if submission_id == base:
        return 1
    match = re.fullmatch(re.escape(base) + r"-(\d+)", submission_id)
    return int(match.group(1)) if match else None


def plan_submission(existing: Sequence[JobRecord], base: str) -> tuple[str, JobRecord | None]:
    """The id to follow and the job to adopt (None: submit a new job under that id).

    The latest attempt decides: pending, running or succeeded is adopted; failed or stopped is
    retried as the next attempt.
    """
    attempts = sorted(
        ((number, job) for job in existing if (number := _attempt(job.submission_id, base)) is not None),
        key=lambda pair: pair[0],
    )
    if not attempts:
        return base, None
    number, latest = attempts[-1]
    if latest.status in ADOPTABLE_STATES:
        return latest.submission_id, latest
    return f"{base}-{number + 1}", None


# --- commands run in the pods --------------------------------------------------------------------

# Runs in the head pod with the image's Python (standard library only): the Jobs REST API
# answers in JSON, where `ray job status/logs` print text meant for people.
JOBS_API_SCRIPT = """\
import json, sys, urllib.error, urllib.request
address, action, subject = sys.argv[1:4]
def get(path):
    try:
        with urllib.request.urlopen(address.rstrip("/") + path, timeout=60) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
def record(job):
    return {key: job.get(key) for key in ("submission_id", "job_id", "status", "message")}
if action == "list":
    jobs = [record(job) for job in get("/api/jobs/") or [] if (job.get("submission_id") or "").startswith(subject)]
    print(json.dumps({"jobs": jobs}))
else:
    offset = int(sys.argv[4])
    job = get("/api/jobs/" + subject)
    logs = ((get("/api/jobs/" + subject + "/logs") or {}).get("logs") or "") if job else ""
    print(json.dumps({"job": job and record(job), "logs": logs[offset:], "offset": len(logs)}))
"""

# Selects the Ray worker logs of one Ray job in a session log folder: `worker-<id>-<job>-<pid>`.
_JOB_LOG_FILES = """\
cd "$1" || exit 3
files=$(ls -1 | grep -E "^worker-[0-9a-f]+-$2-[0-9]+[.](out|err)$")
echo "log files: $(printf '%s\\n' $files | grep -c .)"
[ -n "$files" ] || exit 0
"""
NCCL_LINES_SCRIPT = _JOB_LOG_FILES + 'grep -h -F NCCL $files | head -n "$3"\n'
LOG_TAIL_SCRIPT = _JOB_LOG_FILES + 'tail -q -n "$3" $(ls -1tr $files) | tail -n "$3"\n'
_LOG_FILES_LINE = re.compile(r"^log files: (\d+)$")
_RAY_JOB_ID = re.compile(r"^[0-9a-f]+$")


def submit_command(
    dashboard: str, submission_id: str, code_dir: str, job_args: Sequence[str], env_vars: Mapping[str, str]
) -> list[str]:
    """`ray job submit` of `python -m training` with the shipped code as working directory.

    The run folder is named after the submission id, so checkpoints and summaries in the
    storage path can be found from the stack output.
    """
    argv = ["ray", "job", "submit", "--address", dashboard, "--submission-id", submission_id, "--no-wait"]
    argv += ["--working-dir", code_dir]
    if env_vars:
        argv += ["--runtime-env-json", json.dumps({"env_vars": dict(env_vars)}, sort_keys=True)]
    argv += ["--", "python", "-m", "training", *job_args]
    if "--run-name" not in job_args:
        argv += ["--run-name", submission_id]
    return argv


def list_jobs_command(dashboard: str, prefix: str) -> list[str]:
    return ["python", "-c", JOBS_API_SCRIPT, dashboard, "list", prefix]


def poll_job_command(dashboard: str, submission_id: str, log_offset: int) -> list[str]:
    return ["python", "-c", JOBS_API_SCRIPT, dashboard, "poll", submission_id, str(log_offset)]


def code_hash_command(code_dir: str) -> list[str]:
    return ["cat", str(PurePosixPath(code_dir) / manifests.CODE_HASH_FILE)]


def nccl_lines_command(log_dir: str, ray_job_id: str) -> list[str]:
    return ["sh", "-c", NCCL_LINES_SCRIPT, "sh", log_dir, ray_job_id, str(NCCL_LINES_PER_POD)]


def log_tail_command(log_dir: str, ray_job_id: str) -> list[str]:
    return ["sh", "-c", LOG_TAIL_SCRIPT, "sh", log_dir, ray_job_id, str(LOG_TAIL_LINES)]


def split_log_listing(stdout: str) -> tuple[int, list[str]]:
    """(number of log files, their lines) from the output of the log scripts."""
    lines = stdout.splitlines()
    if lines and (match := _LOG_FILES_LINE.match(lines[0])):
        return int(match.group(1)), lines[1:]
    return 0, lines


def _last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ValueError("no JSON object in the output")


def _record(job: Mapping[str, Any]) -> JobRecord:
    return JobRecord(job["submission_id"], job["status"], job.get("job_id"), job.get("message"))


# --- pure checks ------------------------------------------------------------------------------


def gpu_node_problems(
    nodes: Sequence[NodeFacts], gpus_per_node: int, efa_per_node: int, worker_pods: int
) -> list[str]:
    """What keeps the GPU nodes from running the job, one line per problem (empty: ready)."""
    if not nodes:
        return [
            f"no node carries the label {GPU_NODE_LABEL_SELECTOR}: the GPU node group has not joined the cluster"
        ]
    problems = []
    if len(nodes) < worker_pods:
        problems.append(f"{len(nodes)} GPU nodes for {worker_pods} Ray worker pods (one worker pod per node)")
    for node in sorted(nodes, key=lambda node: node.name):
        missing = []
        if not node.ready:
            missing.append("the node is not Ready")
        gpus = _quantity(node.allocatable.get(GPU_RESOURCE))
        if gpus != gpus_per_node:
            missing.append(
                f"allocatable {GPU_RESOURCE} is {gpus if gpus is not None else 'absent'}, expected {gpus_per_node} "
                "(is the nvidia-device-plugin pod running on it?)"
            )
        efa = _quantity(node.allocatable.get(EFA_RESOURCE))
        if efa_per_node and (efa is None or efa < efa_per_node):
            missing.append(
                f"allocatable {EFA_RESOURCE} is {efa if efa is not None else 'absent'}, expected at least "
                f"{efa_per_node} (is the aws-efa-k8s-device-plugin pod running on it, and does its launch "
                "template attach an EFA interface?)"
            )
        if node.labels.get(GPU_PRESENT_LABEL) != "true":
            missing.append(f"label {GPU_PRESENT_LABEL}=true is missing (not the EKS NVIDIA AMI?)")
        problems += [f"node {node.name}: {reason}" for reason in missing]
    return problems


def _quantity(value: str | None) -> int | None:
    """Extended resources are whole numbers; anything else counts as absent."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def pods_waiting_for(heads: Sequence[PodFacts], workers: Sequence[PodFacts], worker_pods: int) -> list[str]:
    """What the readiness wait still waits for (empty: one head and every worker are Ready)."""
    waiting = []
    if not any(pod.ready for pod in heads):
        waiting.append("the head pod" if heads else "a head pod (none exists yet)")
    ready_workers = sum(pod.ready for pod in workers)
    if ready_workers < worker_pods:
        waiting.append(f"{worker_pods - ready_workers} of {worker_pods} worker pods ({len(workers)} exist)")
    return waiting


def describe_pod(pod: PodFacts, events: Sequence[str]) -> str:
    state = "Ready" if pod.ready else "not Ready"
    where = f" on {pod.node_name}" if pod.node_name else " (not scheduled)"
    lines = [f"{pod.name}: {pod.phase}, {state}{where}" + (" (terminating)" if pod.terminating else "")]
    lines += [f"    {problem}" for problem in pod.problems]
    lines += [f"    event {event}" for event in events]
    return "\n".join(lines)


# --- the job's log ------------------------------------------------------------------------------


class JobLog:
    """The driver's log as it arrives: step metrics, NCCL lines relayed by Ray, and the tail."""

    TAIL_LINES = 200  # the summary is the last line the driver prints, Ray's shutdown lines may follow

    def __init__(self) -> None:
        self._partial = ""
        self.tail: deque[str] = deque(maxlen=self.TAIL_LINES)
        self.nccl_lines: list[str] = []
        self.steps: list[dict] = []

    def feed(self, text: str) -> list[dict]:
        """Take new log text; returns the step metrics it completed."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return [step for line in lines if (step := self._take(line)) is not None]

    def close(self) -> list[dict]:
        """The last line may lack its newline."""
        rest, self._partial = self._partial, ""
        step = self._take(rest) if rest else None
        return [step] if step else []

    def _take(self, line: str) -> dict | None:
        self.tail.append(line)
        if "NCCL" in line and len(self.nccl_lines) < NCCL_LINES_PER_POD:
            self.nccl_lines.append(line)
        step = parse_step_line(line)
        if step is not None:
            self.steps.append(step)
        return step

    def summary(self) -> dict | None:
        return parse_summary("\n".join(self.tail))

    def last_lines(self, count: int = LOG_TAIL_LINES) -> list[str]:
        return list(self.tail)[-count:]


# --- the run ------------------------------------------------------------------------------------


@dataclass
class RunEnvironment:
    """Where and how a run talks to the cluster; `connect_to_eks` builds the real one.

    The end-to-end test builds one over a local Ray head: `KubernetesCluster` over a fake
    Kubernetes API, `LocalExecutor`s, and the local dashboard, session log folder and code folder.
    """

    cluster: ClusterApi
    executor_for: Callable[[PodFacts], Executor]
    dashboard_address: str = DASHBOARD_ADDRESS
    code_dir: str = manifests.CODE_MOUNT
    ray_log_dir: str = RAY_LOG_DIR
    log: Callable[[str], None] = pulumi.log.info
    poll_interval_s: float = 10.0
    readiness_timeout_s: float = 20 * 60  # node join, device plugins, and a ~20 GB image pull
    code_sync_timeout_s: float = 5 * 60  # kubelet sync period plus its ConfigMap cache TTL
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass
class JobResult:
    """One finished, successful job and what its logs say."""

    submission_id: str
    status: str
    summary: dict
    verdict: Verdict
    log_files: dict[str, int] = field(default_factory=dict)


@dataclass
class RayPods:
    """The RayCluster's pods a run uses, once Ready."""

    head: PodFacts
    workers: list[PodFacts]


class TrainingRunner:
    """One run of the resource: checks, job(s), verdict(s), outputs."""

    def __init__(self, inputs: RunInputs, env: RunEnvironment) -> None:
        self.inputs = inputs
        self.env = env

    # -- waiting ----------------------------------------------------------------------------

    def _until(self, timeout_s: float, attempt: Callable[[], Any]) -> tuple[bool, Any]:
        """Call `attempt` until it returns (True, value) or the time is up: (False, last value)."""
        deadline = self.env.clock() + timeout_s
        while True:
            done, value = attempt()
            if done or self.env.clock() >= deadline:
                return done, value
            self.env.sleep(self.env.poll_interval_s)

    def wait_for_gpu_nodes(self, worker_pods: int) -> None:
        inputs = self.inputs

        def attempt():
            nodes = self.env.cluster.list_nodes(GPU_NODE_LABEL_SELECTOR)
            problems = gpu_node_problems(nodes, inputs.gpus_per_node, inputs.efa_per_node, worker_pods)
            return not problems, (nodes, problems)

        ready, (nodes, problems) = self._until(self.env.readiness_timeout_s, attempt)
        if not ready:
            raise TrainingRunError(
                f"the GPU nodes cannot run the training job after {self.env.readiness_timeout_s / 60:.0f} min:\n"
                + "\n".join(f"  - {problem}" for problem in problems)
            )
        self.env.log(
            f"training run: {len(nodes)} GPU nodes ready ({inputs.gpus_per_node} {GPU_RESOURCE}, "
            f">= {inputs.efa_per_node} {EFA_RESOURCE} each)"
        )

    def wait_for_pods(self, worker_pods: int) -> RayPods:
        inputs = self.inputs
        head_selector = manifests.head_pod_selector(inputs.ray_cluster_name)
        worker_selector = manifests.worker_pod_selector(inputs.ray_cluster_name)

        def attempt():
            heads = [
                p for p in self.env.cluster.list_pods(inputs.namespace, head_selector) if not p.terminating
            ]
            workers = [
                p for p in self.env.cluster.list_pods(inputs.namespace, worker_selector) if not p.terminating
            ]
            waiting = pods_waiting_for(heads, workers, worker_pods)
            return not waiting, (heads, workers, waiting)

        ready, (heads, workers, waiting) = self._until(self.env.readiness_timeout_s, attempt)
        if not ready:
            pods = [*heads, *workers]
            described = [
                describe_pod(pod, self.env.cluster.pod_events(inputs.namespace, pod.name)) for pod in pods
            ]
            raise TrainingRunError(
                f"RayCluster {inputs.namespace}/{inputs.ray_cluster_name} is not ready after "
                f"{self.env.readiness_timeout_s / 60:.0f} min: waiting for {' and '.join(waiting)}\n"
                + ("\n".join(described) if described else "no pods exist: is the KubeRay operator running?")
            )
        head = next(pod for pod in heads if pod.ready)
        ready_workers = [pod for pod in workers if pod.ready]
        self.env.log(f"training run: head pod {head.name} and {len(ready_workers)} worker pods Ready")
        return RayPods(head, ready_workers)

    def wait_for_code(self, head: Executor, head_name: str) -> None:
        """The ConfigMap mount updates lazily: submit only once the head sees this code."""
        command = code_hash_command(self.env.code_dir)

        def attempt():
            result = head.run(command, COMMAND_TIMEOUT_S)
            seen = result.stdout.strip() if result.returncode == 0 else None
            return seen == self.inputs.code_hash, (seen, result)

        synced, (seen, result) = self._until(self.env.code_sync_timeout_s, attempt)
        if not synced:
            found = (
                f"code hash {seen}" if seen is not None else f"no code hash ({result.output or 'no output'})"
            )
            raise TrainingRunError(
                f"head pod {head_name} sees {found} in {command[1]}, not {self.inputs.code_hash}, after "
                f"{self.env.code_sync_timeout_s / 60:.0f} min: the training-code ConfigMap has not reached the pod "
                "(is it mounted at that path? a restart of the head pod picks it up at once)"
            )

    # -- one job -----------------------------------------------------------------------------

    def _run_checked(
        self, executor: Executor, argv: list[str], what: str, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> str:
        result = executor.run(argv, timeout_s)
        if result.returncode != 0:
            raise TrainingRunError(f"{what} failed (exit {result.returncode}):\n{result.output}")
        return result.stdout

    def _jobs_api(self, head: Executor, argv: list[str], what: str) -> dict:
        stdout = self._run_checked(head, argv, what)
        try:
            return _last_json_line(stdout)
        except ValueError:
            raise TrainingRunError(
                f"{what}: unexpected answer from the Ray Jobs API:\n{stdout[-2000:]}"
            ) from None

    def start_job(self, head: Executor, variant: str, env_vars: Mapping[str, str]) -> str:
        """Adopt the job these inputs already started, or submit it; returns its submission id."""
        dashboard = self.env.dashboard_address
        base = submission_id_base(self.inputs, variant, env_vars)
        listing = self._jobs_api(head, list_jobs_command(dashboard, base), "listing Ray jobs")
        submission_id, adopted = plan_submission([_record(job) for job in listing["jobs"]], base)
        if adopted is not None:
            self.env.log(
                f"training run: following job {submission_id} ({adopted.status}), started by an earlier run"
            )
            return submission_id
        argv = submit_command(dashboard, submission_id, self.env.code_dir, self.inputs.job_args, env_vars)
        self._run_checked(head, argv, f"ray job submit of {submission_id}", SUBMIT_TIMEOUT_S)
        self.env.log(
            f"training run: submitted job {submission_id}: python -m training {' '.join(self.inputs.job_args)}"
        )
        return submission_id

    def follow_job(self, head: Executor, submission_id: str) -> tuple[JobRecord, JobLog]:
        """Poll until the job ends, logging each step; bounded by `timeout_minutes`."""
        log = JobLog()
        offset, status = 0, None
        deadline = self.env.clock() + self.inputs.timeout_minutes * 60
        while True:
            answer = self._jobs_api(
                head,
                poll_job_command(self.env.dashboard_address, submission_id, offset),
                f"polling job {submission_id}",
            )
            if answer["job"] is None:
                raise TrainingRunError(
                    f"job {submission_id} no longer exists on the Ray cluster (was the head pod replaced?)"
                )
            job = _record(answer["job"])
            offset = answer["offset"]
            steps = log.feed(answer["logs"])
            if job.status in TERMINAL_STATES:
                steps += log.close()
            for step in steps:
                self.env.log(f"training run {submission_id}: {format_progress_line(step)}")
            if job.status != status:
                status = job.status
                self.env.log(f"training run: job {submission_id} is {status}")
            if job.status in TERMINAL_STATES:
                return job, log
            if self.env.clock() >= deadline:
                last = format_progress_line(log.steps[-1]) if log.steps else "no step finished yet"
                raise TrainingRunError(
                    f"job {submission_id} still {job.status} after timeout_minutes={self.inputs.timeout_minutes} "
                    f"({last}). It keeps running: the next `pulumi up` waits for it; raise timeout_minutes, or stop "
                    f"it with `ray job stop {submission_id}` in the head pod."
                )
            self.env.sleep(self.env.poll_interval_s)

    def _worker_logs(self, workers: Sequence[PodFacts], argv: list[str]) -> dict[str, tuple[int, list[str]]]:
        """Run a log script on every worker pod: pod name -> (log files, lines)."""
        found = {}
        for pod in workers:
            result = self.env.executor_for(pod).run(argv, COMMAND_TIMEOUT_S)
            if result.returncode != 0:
                raise TrainingRunError(
                    f"reading the Ray logs in {self.env.ray_log_dir} of worker pod {pod.name} failed "
                    f"(exit {result.returncode}): {result.output}"
                )
            found[pod.name] = split_log_listing(result.stdout)
        return found

    def run_job(self, pods: RayPods, variant: str, env_vars: Mapping[str, str]) -> JobResult:
        head = self.env.executor_for(pods.head)
        submission_id = self.start_job(head, variant, env_vars)
        job, log = self.follow_job(head, submission_id)
        ray_job_id = job.ray_job_id if job.ray_job_id and _RAY_JOB_ID.match(job.ray_job_id) else None
        if job.status != "SUCCEEDED":
            raise TrainingRunError(self._failure_report(job, log, pods.workers, ray_job_id))
        summary = log.summary()
        if summary is None:
            raise TrainingRunError(
                f"job {submission_id} succeeded but its log ends without the run summary (a JSON line with "
                f"world_size, steps, tokens_per_s, ...); last lines:\n" + "\n".join(log.last_lines())
            )
        worker_logs = (
            self._worker_logs(pods.workers, nccl_lines_command(self.env.ray_log_dir, ray_job_id))
            if ray_job_id
            else {}
        )
        lines = [line for _, pod_lines in worker_logs.values() for line in pod_lines] + log.nccl_lines
        verdict = classify_lines(lines)
        log_files = {pod: count for pod, (count, _) in worker_logs.items()}
        self.env.log(
            f"training run: job {submission_id}: {summary.get('tokens_per_s')} tokens/s, NCCL transport "
            f"{verdict.transport} ({verdict.reason}); worker log files read: {log_files}"
        )
        return JobResult(submission_id, job.status, summary, verdict, log_files)

    def _failure_report(
        self, job: JobRecord, log: JobLog, workers: Sequence[PodFacts], ray_job_id: str | None
    ) -> str:
        # Ray's message repeats the log's tail after its first line; the tail follows anyway.
        reason = job.message.strip().splitlines()[0] if job.message and job.message.strip() else None
        parts = [f"job {job.submission_id} {job.status}" + (f": {reason}" if reason else "")]
        parts.append("last lines of the driver log:\n" + _indent(log.last_lines()))
        if ray_job_id:
            # The job's failure is the news: a worker pod that cannot be read must not hide it.
            with contextlib.suppress(TrainingRunError, CommandTimeout):
                for pod, (count, lines) in self._worker_logs(
                    workers, log_tail_command(self.env.ray_log_dir, ray_job_id)
                ).items():
                    if lines:
                        parts.append(
                            f"last lines of the job's {count} worker log files on {pod}:\n" + _indent(lines)
                        )
        return "\n".join(parts)

    # -- the whole run -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        inputs = self.inputs
        worker_pods = self.env.cluster.ray_cluster_worker_count(inputs.namespace, inputs.ray_cluster_name)
        self.wait_for_gpu_nodes(worker_pods)
        pods = self.wait_for_pods(worker_pods)
        self.wait_for_code(self.env.executor_for(pods.head), pods.head.name)
        main = self.run_job(pods, MAIN_VARIANT, {})
        check_transport(main, inputs.expect_transport)
        outputs = run_outputs(main)
        if inputs.benchmark:
            tcp = self.run_job(pods, TCP_VARIANT, TCP_BASELINE_ENV)
            check_transport(tcp, "socket")
            outputs.update(benchmark_outputs(main, tcp))
        return outputs


def _indent(lines: Sequence[str]) -> str:
    return "\n".join(f"    {line}" for line in lines) if lines else "    (empty)"


# --- decisions and outputs ------------------------------------------------------------------------


def check_transport(result: JobResult, expect: str) -> None:
    """Fail with the evidence when NCCL did not use the expected transport."""
    verdict = result.verdict
    if verdict.ok(expect):
        return
    evidence = _indent(verdict.evidence) if verdict.evidence else "    (no line decided it)"
    raise TrainingRunError(
        f"NCCL used '{verdict.transport}' between the nodes, not '{expect}' (job {result.submission_id}, "
        f"{verdict.confidence} confidence): {verdict.reason}\n"
        f"evidence:\n{evidence}\n"
        f"worker log files read: {result.log_files or 'none (the job has no Ray job id or no worker pods)'}\n"
        "check that the worker pods request vpc.amazonaws.com/efa and set FI_PROVIDER=efa and "
        "NCCL_NET_PLUGIN=ofi, and look for 'NET/OFI' lines in the worker logs "
        f"({RAY_LOG_DIR}/worker-*.out): they say why aws-ofi-nccl did not load"
    )


def run_outputs(result: JobResult) -> dict[str, Any]:
    summary = result.summary
    return {
        "job_id": result.submission_id,
        "status": result.status,
        "transport": result.verdict.transport,
        "transport_reason": result.verdict.reason,
        "evidence": list(result.verdict.evidence),
        "worker_log_files": dict(result.log_files),
        "tokens_per_s": summary.get("tokens_per_s"),
        "mfu": summary.get("mfu"),
        "step_time_s": summary.get("step_time_s"),
        "duration_s": summary.get("duration_s"),
        "summary": summary,
        "tcp_job_id": None,
        "tcp_transport": None,
        "tcp_evidence": None,
        "tcp_tokens_per_s": None,
        "efa_speedup": None,
    }


def benchmark_outputs(main: JobResult, tcp: JobResult) -> dict[str, Any]:
    """The TCP baseline and the speedup of the main run over it (tokens/s over tokens/s)."""
    main_rate, tcp_rate = main.summary.get("tokens_per_s"), tcp.summary.get("tokens_per_s")
    return {
        "tcp_job_id": tcp.submission_id,
        "tcp_transport": tcp.verdict.transport,
        "tcp_evidence": list(tcp.verdict.evidence),
        "tcp_tokens_per_s": tcp_rate,
        "efa_speedup": round(main_rate / tcp_rate, 3) if main_rate and tcp_rate else None,
    }


# --- the dynamic provider and resource ------------------------------------------------------------


@contextlib.contextmanager
def connect_to_eks(inputs: RunInputs, aws_profile: str | None) -> Iterator[RunEnvironment]:
    """The real environment: a Kubernetes client for the EKS cluster, pods reached by exec."""
    with eks_api_client(inputs.cluster_name, inputs.region, aws_profile) as api_client:
        cluster = KubernetesCluster(
            kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
        )
        yield RunEnvironment(cluster, executor_for=lambda pod: cluster.executor(inputs.namespace, pod))


Connect = Callable[[RunInputs, str | None], contextlib.AbstractContextManager[RunEnvironment]]


class TrainingRunProvider(pulumi.dynamic.ResourceProvider):
    """CRUD of `TrainingRun`; `connect` opens the environment a run talks to (see module doc)."""

    def __init__(self, connect: Connect = connect_to_eks) -> None:
        super().__init__()
        self._connect = connect
        self._aws_profile: str | None = None

    def configure(self, req: pulumi.dynamic.ConfigureRequest) -> None:
        """The stack's `aws:profile` (a profile name, not a credential) picks the AWS identity."""
        self._aws_profile = req.config.get("aws:profile")

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [pulumi.dynamic.CheckFailure(key, reason) for key, reason in input_problems(news)]
        return pulumi.dynamic.CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        return diff_props(olds, news)

    def _run(self, props: dict[str, Any]) -> dict[str, Any]:
        inputs = RunInputs.from_props(props)
        with self._connect(inputs, self._aws_profile) as env:
            outputs = TrainingRunner(inputs, env).run()
        return {**inputs.props(), **outputs}

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(uuid.uuid4().hex, self._run(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(self._run(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing to remove: a finished job holds no resources; its history goes with the RayCluster."""


class TrainingRun(pulumi.dynamic.Resource, module="workloads", name="TrainingRun"):
    """The training job of `pulumi up`, its NCCL transport verdict and its throughput."""

    job_id: pulumi.Output[str]
    status: pulumi.Output[str]
    transport: pulumi.Output[str]
    transport_reason: pulumi.Output[str]
    evidence: pulumi.Output[list]
    worker_log_files: pulumi.Output[dict]
    tokens_per_s: pulumi.Output[float]
    mfu: pulumi.Output[float | None]
    step_time_s: pulumi.Output[float]
    duration_s: pulumi.Output[float]
    summary: pulumi.Output[dict]
    tcp_job_id: pulumi.Output[str | None]
    tcp_transport: pulumi.Output[str | None]
    tcp_evidence: pulumi.Output[list | None]
    tcp_tokens_per_s: pulumi.Output[float | None]
    efa_speedup: pulumi.Output[float | None]

    def __init__(
        self,
        name: str,
        *,
        cluster_name: pulumi.Input[str],
        region: pulumi.Input[str],
        namespace: pulumi.Input[str],
        ray_cluster_name: pulumi.Input[str],
        gpus_per_node: pulumi.Input[int],
        efa_per_node: pulumi.Input[int],
        code_hash: pulumi.Input[str],
        job_args: pulumi.Input[list[str]],
        expect_transport: str = "efa",
        benchmark: bool = False,
        timeout_minutes: int = 60,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "cluster_name": cluster_name,
            "region": region,
            "namespace": namespace,
            "ray_cluster_name": ray_cluster_name,
            "gpus_per_node": gpus_per_node,
            "efa_per_node": efa_per_node,
            "code_hash": code_hash,
            "job_args": job_args,
            "expect_transport": expect_transport,
            "benchmark": benchmark,
            "timeout_minutes": timeout_minutes,
            **dict.fromkeys(OUTPUTS),
        }
        super().__init__(TrainingRunProvider(), name, props, opts)
