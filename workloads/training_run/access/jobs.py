"""How a job is submitted and followed: a typed Ray Jobs client over the head pod's exec channel.

The Ray dashboard is never exposed: every call is a command run inside the head pod, which
reaches the dashboard on `localhost:8265`. Submitting is `ray job submit --no-wait` (it zips and
uploads the shipped code as the working directory); listing and polling run `head_jobs_api`
there, which answers the Jobs REST API as JSON. Both carry the RayCluster's Ray token from the head
container's environment, where KubeRay put it (`manifests.RAY_AUTH_OPTIONS`): `ray job submit` as
Ray's SDK attaches it in token mode (ray/dashboard/modules/dashboard_sdk.py,
`get_auth_headers_if_auth_enabled`), `head_jobs_api` as its `Authorization` header.

Job identity. The submission id is derived from what makes the job what it is (see
`RunInputs.job_identity`), so a `pulumi up` interrupted while the job runs is followed by one
that finds the job and waits for it instead of starting a second one. The latest attempt
decides (`choose_submission`): pending or running is adopted; failed or stopped is retried under
`<id>-2`, `<id>-3`, ... A succeeded job is judged again (without retraining) only while the pods
that ran it are the pods now: each job carries the pods it was submitted to (`PODS_METADATA`, name
and UID of each, in the job's Ray metadata). On other pods it proves nothing about them, so a new
attempt runs: a fix made outside the job's identity (an EFA security-group rule, a device plugin, a
node roll) is proven by the next `pulumi up` once the pods were replaced. Ray keeps job history
while the head pod lives; a new head means a new run.

A fabric probe is never judged again (`rejudge=False`): it costs a minute, and the EFA counters
must be read around the very probe that is judged, so every `pulumi up` runs a fresh one.

What the TrainingRun measured around a job that Ray does not hold (the EFA counters before it, and
their judgement once it ended) is recorded beside Ray's job history, in the head pod's `/tmp/ray`
emptyDir (`record_path`), which lives as long as the head pod; submitting under an id overwrites
its record, so a record never outlives the job it belongs to.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from infra.aws_rules.node_repair import NODE_REPLACEMENT_S
from platform_contract import PROJECT, RAY_PORTS
from training.config.settings import WORKER_GROUP_START_TIMEOUT_ENV
from workloads import manifests
from workloads.training_run.access import head_jobs_api
from workloads.training_run.access.commands import COMMAND_TIMEOUT_S, CommandTimeout, Executor
from workloads.training_run.errors import ExecStreamCut, TrainingRunError

T = TypeVar("T")
DASHBOARD_ADDRESS = f"http://localhost:{RAY_PORTS['dashboard']}"
JOB_ID_PREFIX = PROJECT
# NCCL's own log file per process (`NCCL_DEBUG_FILE`; NCCL src/debug.cc expands %h to the host
# name up to its first dot and %p to the pid, and line-buffers the file). On stdout NCCL's lines
# are block-buffered, and Ray ends its workers with `_Exit`, which drops the last unflushed block:
# often the channel lines of the first collective. The folder is the Ray pods' emptyDir; NCCL
# does not create folders (it falls back to stdout), so the file lies in it directly.
NCCL_LOG_DIR = manifests.RAY_TMP_DIR
# Ray Train's wait for a worker group to start, a restarted one included (ray/train/v2/_internal/
# constants.py, default 60 s): long enough for the node group to replace a lost GPU node
# (`NODE_REPLACEMENT_S`). In the job's runtime environment, which reaches its driver; Ray Train
# passes it on to its controller (`ENV_VARS_TO_PROPAGATE`), and the training driver sets its own
# default only where the variable is unset.
RESTART_ENV = {WORKER_GROUP_START_TIMEOUT_ENV: str(NODE_REPLACEMENT_S)}
PODS_METADATA = f"{PROJECT}/pods"  # Ray job metadata key: the pods the job was submitted to
RECORD_DIR = f"{PROJECT}-records"  # below the head pod's /tmp/ray: one JSON record per submission id
WRITE_RECORD_SCRIPT = 'mkdir -p "${1%/*}" && printf "%s" "$2" > "$1"'
READ_RECORD_SCRIPT = 'cat "$1" 2>/dev/null || true'

SUBMIT_TIMEOUT_S = 600  # `ray job submit` zips and uploads the working directory first
READ_ATTEMPTS = 3  # list and poll only read: a cut stream is simply asked again
HEAD_JOBS_API_SOURCE = Path(head_jobs_api.__file__).read_text()


class JobStatus(enum.StrEnum):
    """Ray's `ray.job_submission.JobStatus`, value for value."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        """As Ray's `JobStatus.is_terminal`: the job will not change any more."""
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobRecord:
    """One Ray job as the Jobs API reports it; `metadata` is what `--metadata-json` attached."""

    submission_id: str
    status: JobStatus
    ray_job_id: str | None = None
    message: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_api(cls, job: Mapping[str, Any]) -> JobRecord:
        return cls(
            job["submission_id"],
            JobStatus(job["status"]),
            job.get("job_id"),
            job.get("message"),
            dict(job.get("metadata") or {}),
        )

    @property
    def pods(self) -> str | None:
        """The pods the job was submitted to (`RayPods.identity`); None for a job submitted without."""
        return self.metadata.get(PODS_METADATA)


@dataclass(frozen=True)
class SubmissionChoice:
    """What `choose_submission` decided: the id to follow, the job to adopt (None: submit one under
    that id), and why, when an earlier attempt is passed over or judged again."""

    submission_id: str
    adopted: JobRecord | None
    note: str | None = None


@dataclass(frozen=True)
class JobPoll:
    """One look at a job: its record (None: gone) and the driver log text since the last look."""

    job: JobRecord | None
    logs: str
    offset: int


def submission_id_base(identity: Mapping[str, Any], variant: str, env_vars: Mapping[str, str]) -> str:
    """Stable id of the job: same identity, variant and environment, same id, on any `pulumi up`."""
    text = json.dumps({**identity, "env_vars": dict(env_vars)}, sort_keys=True)
    return f"{JOB_ID_PREFIX}-{variant}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _attempt(submission_id: str, base: str) -> int | None:
    if submission_id == base:
        return 1
    match = re.fullmatch(re.escape(base) + r"-(\d+)", submission_id)
    return int(match.group(1)) if match else None


def nccl_debug_file(nccl_log_dir: str, submission_id: str) -> str:
    """Where each NCCL process of the job writes its log: `nccl-<submission id>.<host>.<pid>.log`."""
    return f"{nccl_log_dir}/nccl-{submission_id}.%h.%p.log"


def record_path(nccl_log_dir: str, submission_id: str) -> str:
    """Where the head pod keeps what the TrainingRun measured around the job (`RECORD_DIR`)."""
    return f"{nccl_log_dir}/{RECORD_DIR}/{submission_id}.json"


def choose_submission(
    existing: Sequence[JobRecord], base: str, pods: str, rejudge: bool = True
) -> SubmissionChoice:
    """Adopt the latest attempt while it is pending or running, or succeeded on `pods` (the pods
    now, `RayPods.identity`) when finished jobs may be judged again (`rejudge`); else submit the
    next attempt."""
    attempts = sorted(
        ((number, job) for job in existing if (number := _attempt(job.submission_id, base)) is not None),
        key=lambda pair: pair[0],
    )
    if not attempts:
        return SubmissionChoice(base, None)
    number, latest = attempts[-1]
    following = f"{base}-{number + 1}"
    if latest.status in (JobStatus.PENDING, JobStatus.RUNNING):
        return SubmissionChoice(latest.submission_id, latest)
    if latest.status != JobStatus.SUCCEEDED:
        return SubmissionChoice(following, None)
    if not rejudge:
        return SubmissionChoice(
            following,
            None,
            f"job {latest.submission_id} SUCCEEDED earlier; a probe is never judged again, so {following} "
            "judges the fabric now",
        )
    if latest.pods == pods:
        return SubmissionChoice(
            latest.submission_id,
            latest,
            f"job {latest.submission_id} SUCCEEDED earlier on these very pods (same names and UIDs); its "
            "logs are judged again without retraining. A fix outside the run's inputs (security group, "
            "device plugin, node) is proven only on new pods: replace the worker pods and run `pulumi up`",
        )
    ran_on = "pods it did not record" if latest.pods is None else "other pods"
    return SubmissionChoice(
        following,
        None,
        f"job {latest.submission_id} SUCCEEDED earlier on {ran_on}, so its logs say nothing of these "
        f"pods; submitting {following} to judge them",
    )


def submit_command(
    dashboard: str,
    submission_id: str,
    code_dir: str,
    job_args: Sequence[str],
    env_vars: Mapping[str, str],
    pods: str,
    nccl_log_dir: str = NCCL_LOG_DIR,
    module: str = "training",
) -> list[str]:
    """`ray job submit` of `python -m <module>` (the training job, or the fabric probe) with the
    shipped code as working directory.

    The run folder is named after the submission id, so checkpoints and summaries in the
    storage path can be found from the stack output. The job's metadata records `pods`. The
    job's runtime environment, which Ray Train's workers inherit, names their NCCL log files and
    gives a restarted worker group the time a node replacement takes (`RESTART_ENV`).
    """
    argv = ["ray", "job", "submit", "--address", dashboard, "--submission-id", submission_id, "--no-wait"]
    argv += ["--working-dir", code_dir, "--metadata-json", json.dumps({PODS_METADATA: pods})]
    env = {**RESTART_ENV, **env_vars, "NCCL_DEBUG_FILE": nccl_debug_file(nccl_log_dir, submission_id)}
    argv += ["--runtime-env-json", json.dumps({"env_vars": env}, sort_keys=True)]
    argv += ["--", "python", "-m", module, *job_args]
    if module == "training" and "--run-name" not in job_args:
        argv += ["--run-name", submission_id]
    return argv


def jobs_api_command(dashboard: str, *args: str) -> list[str]:
    """`head_jobs_api` run by the head pod's Python."""
    return ["python", "-c", HEAD_JOBS_API_SOURCE, dashboard, *args]


def _last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ValueError("no JSON object in the output")


class RayJobsClient:
    """Submit, list and poll Ray jobs from inside the head pod."""

    def __init__(
        self, head: Executor, dashboard: str = DASHBOARD_ADDRESS, nccl_log_dir: str = NCCL_LOG_DIR
    ) -> None:
        self.head = head
        self.dashboard = dashboard
        self.nccl_log_dir = nccl_log_dir

    def _run(self, argv: list[str], what: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        result = self.head.run(argv, timeout_s)
        if result.returncode != 0:
            raise TrainingRunError(f"{what} failed (exit {result.returncode}):\n{result.output}")
        return result.stdout

    def _read(self, argv: list[str], what: str, parse: Callable[[dict], T]) -> T:
        """A read-only call: retried when its stream is cut or its answer is garbled."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                stdout = self._run(argv, what)
                return parse(_last_json_line(stdout))
            except (ExecStreamCut, CommandTimeout) as error:
                if attempt == READ_ATTEMPTS:
                    raise TrainingRunError(f"{what}: {error} ({READ_ATTEMPTS} attempts)") from error
            except (ValueError, KeyError) as error:
                raise TrainingRunError(
                    f"{what}: unexpected answer from the Ray Jobs API ({error}):\n{stdout[-2000:]}"
                ) from error
        raise AssertionError("unreachable")

    def list(self, prefix: str) -> list[JobRecord]:
        """The jobs whose submission id starts with `prefix`."""
        return self._read(
            jobs_api_command(self.dashboard, "list", prefix),
            "listing Ray jobs",
            lambda answer: [JobRecord.from_api(job) for job in answer["jobs"]],
        )

    def poll(self, submission_id: str, log_offset: int) -> JobPoll:
        """The job's state and the driver log text after `log_offset`."""

        def parse(answer: dict) -> JobPoll:
            job = JobRecord.from_api(answer["job"]) if answer["job"] else None
            return JobPoll(job, answer["logs"], answer["offset"])

        return self._read(
            jobs_api_command(self.dashboard, "poll", submission_id, str(log_offset)),
            f"polling job {submission_id}",
            parse,
        )

    def write_record(self, submission_id: str, record: Mapping[str, Any]) -> None:
        """Keep `record` beside the job in the head pod (`record_path`)."""
        path = record_path(self.nccl_log_dir, submission_id)
        self._run(
            ["sh", "-c", WRITE_RECORD_SCRIPT, "sh", path, json.dumps(record, sort_keys=True)],
            f"recording what was measured around job {submission_id} in {path}",
        )

    def read_record(self, submission_id: str) -> dict[str, Any] | None:
        """The job's record (`write_record`); None when there is none."""
        path = record_path(self.nccl_log_dir, submission_id)
        stdout = self._run(["sh", "-c", READ_RECORD_SCRIPT, "sh", path], f"reading {path}")
        try:
            record = json.loads(stdout) if stdout.strip() else None
        except json.JSONDecodeError:
            return None
        return record if isinstance(record, dict) else None

    def submit(
        self,
        submission_id: str,
        code_dir: str,
        job_args: Sequence[str],
        env_vars: Mapping[str, str],
        pods: str,
        module: str = "training",
    ) -> None:
        """Submit without waiting. A cut stream leaves it unknown whether Ray took the job: look."""
        argv = submit_command(
            self.dashboard, submission_id, code_dir, job_args, env_vars, pods, self.nccl_log_dir, module
        )
        try:
            self._run(argv, f"ray job submit of {submission_id}", SUBMIT_TIMEOUT_S)
        except ExecStreamCut:
            if not any(job.submission_id == submission_id for job in self.list(submission_id)):
                raise
