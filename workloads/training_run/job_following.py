"""Following a job to its end over the Ray head pod's Jobs API, through a head pod's replacement.

`JobFollowing.follow_job` polls the job until it ends, logging each step, bounded by
`timeout_minutes` and Ctrl-C; `TrainingRunner` (`runner`) is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from training.metrics.report import format_progress_line
from workloads import manifests
from workloads.training_run.access.cluster_api import ClusterApi, PodFacts
from workloads.training_run.access.commands import Executor
from workloads.training_run.access.jobs import JobRecord, RayJobsClient
from workloads.training_run.errors import Interrupted, PodGone, TrainingRunError
from workloads.training_run.readiness import Pace, RayPods
from workloads.training_run.schema import RunInputs
from workloads.training_run.verdicts.evidence import JobLog


class FollowEnvironment(Protocol):
    """What following a job needs of the run's environment (`runner.RunEnvironment`)."""

    cluster: ClusterApi
    dashboard_address: str
    nccl_log_dir: str
    poll_interval_s: float
    readiness_timeout_s: float

    @property
    def executor_for(self) -> Callable[[PodFacts], Executor]: ...
    @property
    def log(self) -> Callable[[str], None]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], None]: ...
    @property
    def pace(self) -> Pace: ...


class JobFollowing:
    """Follows a run's jobs; `in_flight` is the job started or adopted and not yet seen to end."""

    request: RunInputs
    env: FollowEnvironment
    in_flight: str | None

    def jobs_client(self, head: PodFacts) -> RayJobsClient:
        """The Ray Jobs client over exec in `head`."""
        return RayJobsClient(self.env.executor_for(head), self.env.dashboard_address, self.env.nccl_log_dir)

    def replacement_head(self, gone: PodFacts) -> PodFacts:
        """The Ready head pod that took over from `gone`, waited for as long as the readiness wait."""
        selector = manifests.head_pod_selector(self.request.ray_cluster_name)

        def attempt():
            heads = [
                pod
                for pod in self.env.cluster.list_pods(self.request.namespace, selector)
                if pod.ready and not pod.terminating and pod.name != gone.name
            ]
            return bool(heads), heads

        found, heads = self.env.pace.until(self.env.readiness_timeout_s, attempt)
        if not found:
            raise TrainingRunError(
                f"head pod {gone.name} is gone and no new Ray head pod became Ready within "
                f"{self.env.readiness_timeout_s / 60:.0f} min; the Ray job history went with it. Check the "
                f"RayCluster (`kubectl -n {self.request.namespace} describe raycluster "
                f"{self.request.ray_cluster_name}`); once its head is Ready, `pulumi up` submits the job again"
            )
        return heads[0]

    def follow_job(self, pods: RayPods, jobs: RayJobsClient, submission_id: str) -> tuple[JobRecord, JobLog]:
        """Poll until the job ends, logging each step; bounded by `timeout_minutes` and Ctrl-C.

        Ray keeps its jobs in the head pod. When the head pod is replaced (404 on exec), the new
        head is looked up once: a job still listed there is followed on, a missing one ends the run
        saying so (`pods.head` is the new head either way)."""
        log = JobLog()
        offset, status = 0, None
        seen = "not polled yet"
        replaced: str | None = None
        deadline = self.env.clock() + self.request.timeout_minutes * 60
        try:
            while True:
                try:
                    answer = jobs.poll(submission_id, offset)
                except PodGone as gone:
                    if replaced is not None or gone.pod != pods.head.name:
                        raise
                    replaced = pods.head.name
                    pods.head = self.replacement_head(pods.head)
                    self.env.log(f"training run: head pod {replaced} was replaced by {pods.head.name}")
                    jobs = self.jobs_client(pods.head)
                    continue
                if answer.job is None:
                    if replaced is not None:
                        raise TrainingRunError(
                            f"head pod {replaced} was replaced by {pods.head.name} while job {submission_id} ran "
                            f"({seen}); Ray keeps job history in the head pod, so the job's state and logs went with "
                            "it. Run `pulumi up` again: it submits the job afresh on the new head"
                        )
                    raise TrainingRunError(
                        f"job {submission_id} no longer exists on the Ray head pod {pods.head.name} ({seen}): "
                        "the Ray head restarted and lost its job history. Run `pulumi up` again: it submits "
                        "the job afresh"
                    )
                job, offset = answer.job, answer.offset
                steps = log.feed(answer.logs)
                if job.status.is_terminal:
                    steps += log.close()
                for step in steps:
                    self.env.log(f"training run {submission_id}: {format_progress_line(step)}")
                if job.status != status:
                    status = job.status
                    self.env.log(f"training run: job {submission_id} is {status}")
                if job.status.is_terminal:
                    self.in_flight = None
                    return job, log
                last = format_progress_line(log.steps[-1]) if log.steps else "no step finished yet"
                seen = f"{job.status}, {last}"
                if self.env.clock() >= deadline:
                    raise TrainingRunError(
                        f"job {submission_id} still {job.status} after timeout_minutes={self.request.timeout_minutes} "
                        f"({last}). It keeps running: the next `pulumi up` waits for it; raise timeout_minutes, or stop "
                        f"it with `ray job stop {submission_id}` in the head pod."
                    )
                self.env.sleep(self.env.poll_interval_s)
        except Interrupted:
            raise Interrupted(
                f"interrupted: stopped waiting for job {submission_id} ({seen}). The job keeps "
                "running on the Ray cluster and the next `pulumi up` follows it to its end; to stop it, run "
                f"`ray job stop {submission_id}` in the head pod."
            ) from None
