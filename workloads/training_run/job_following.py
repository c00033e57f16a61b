"""Following a job to its end over the Ray head pod's Jobs API, and keeping it alive on the way.

`JobFollower.follow_job` polls the job until it ends, logging each step, bounded by
`timeout_minutes` and Ctrl-C; `TrainingRunner` (`runner`) keeps one for the run. Each poll it also
tends the job, one pure judgement per decision with a thin act around it:

- **A driver lost with the head** (`lost_job_refusal`). Ray keeps a job, its driver and its history
  in the head pod. When the head pod is replaced (an exec into it answers 404) the Ready pod that
  took over is looked up: a job still listed there is followed on. A job no longer listed (the pod
  replaced, or its container restarted: a new GCS either way) is submitted again on the new head, by
  the very command that submitted it (`runner.TrainingRunner.submit_job`), under the same
  submission id and so the same `--run-name`: Ray Train v2 resumes a run of that name from its
  folder in the storage path, whose checkpoint manager snapshot names the latest committed
  checkpoint (Ray 2.58 ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py,
  `_maybe_load_state_from_storage`). At most `MAX_RESUBMISSIONS` a run; the loss after that ends the
  run in one line. KubeRay's GCS fault tolerance (`gcsFaultToleranceOptions`, with an external
  Redis) would keep the worker pods' raylets and Ray's records across a head restart, the driver
  being lost all the same; it is not used (docs/operations/head-pod.md).
- **A node whose faults repeat** (`nodes_to_take_out`, `worker_pods_on`). The job's restarted rank 0
  prints a NODE_LEAVING line (`training.metrics.report.format_node_leaving_line`) and its ranks
  wait for the node to be taken out. The follower cordons the node and deletes the Ray worker pods
  of this RayCluster on it with their own grace (the worker turns SIGTERM into a Ray drain, which
  ends the waiting worker group), once per node a run. KubeRay's replacement pod stays Pending until
  EKS auto repair replaces the node. The job asks only with `--leave-failing-node`, which the
  program passes with `gpuNodeAutoRepair` on.
- **A worker pod stuck Terminating on a silent node** (`force_deletion_due`). KubeRay v1.7.0 counts a
  Terminating pod as running, so it creates no replacement while the pod object stays, and a pod on
  a node whose kubelet no longer reports stays until the node comes back or its Node object goes.
  Once `STUCK_TERMINATING_WAIT_S` have passed since the pod's grace ended and since its node's Ready
  condition left True, the follower deletes the pod at once (grace 0).

When the follower took out a worker pod the job started on, the job's evidence is read at its end
from the live worker pods, the replacements among them (`workers_after`). A pod that went otherwise
is named where its logs are read (the gate's "vanished" refusal, `runner`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from training.metrics.report import format_progress_line
from workloads import manifests
from workloads.training_run.access.cluster_api import ClusterApi, NodeFacts, PodFacts
from workloads.training_run.access.commands import Executor
from workloads.training_run.access.jobs import JobRecord, RayJobsClient
from workloads.training_run.errors import ApiUnauthorized, Interrupted, PodGone, TrainingRunError
from workloads.training_run.readiness import GPU_NODE_LABEL_SELECTOR, Pace, RayPods, runs_spec
from workloads.training_run.schema import RunInputs
from workloads.training_run.verdicts.evidence import JobLog

# How often a run submits a job lost with its head again: twice. Each loss costs the steps since the
# last committed checkpoint and a restart of the worker group (the workers' raylets exit with the
# GCS and rejoin the new head). A first loss is a fault (the system node failed, something deleted
# the head); a second may be another. A third in one `pulumi up` says the head cannot stay up where
# it runs (its node, its memory limit), which one more submission would not mend, only hide.
MAX_RESUBMISSIONS = 2
# How long a worker pod may stay Terminating on a node whose kubelet is silent, past both the end of
# its grace (its deletionTimestamp: the delete plus the pod's grace) and its node's Ready condition
# leaving True, before the run deletes it at once: 5 minutes. A silent node is marked Unknown about
# 40 s after its last status and its pods are evicted 300 s later (the default `tolerationSeconds` of
# the `node.kubernetes.io/unreachable` and `not-ready` taints); a kubelet back within minutes (a
# reboot, a partition that heals) ends the pod itself, with Ray's drain, and 5 minutes leave it that
# chance. Without the deletion KubeRay (which counts the Terminating pod as running) creates the
# replacement only once the Node object is gone, after EKS auto repair acted (30 minutes for a
# NotReady node): the restarted worker group waits 20 minutes for its nodes (`jobs.RESTART_ENV`).
STUCK_TERMINATING_WAIT_S = 5 * 60

# Submits the lost job again on the head the client reaches; returns the run name it resumes (None:
# a job without one, the fabric probe).
Resubmit = Callable[[RayJobsClient], str | None]


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
    def wall_clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], None]: ...
    @property
    def pace(self) -> Pace: ...


# --- the judgements ----------------------------------------------------------------------------------


def lost_job_refusal(
    submission_id: str,
    head: str,
    replaced: str | None,
    seen: str,
    resubmitted: int,
    can_resubmit: bool,
    namespace: str,
) -> str | None:
    """None when the job Ray lost with its head (`replaced`: the head pod replaced by `head`; None:
    `head` restarted in place) is to be submitted again; else the run's one-line end: the job cannot
    be submitted from here (`can_resubmit`), or this run already did so `MAX_RESUBMISSIONS` times."""
    if can_resubmit and resubmitted < MAX_RESUBMISSIONS:
        return None
    spent = (
        f"; it was submitted again {resubmitted} time{'' if resubmitted == 1 else 's'} in this run, the most a "
        f"run does ({MAX_RESUBMISSIONS}): find out first why the head keeps going (`kubectl -n {namespace} "
        f"describe pod {head}`: its last state and its node)"
        if can_resubmit
        else ""
    )
    if replaced is not None:
        return (
            f"head pod {replaced} was replaced by {head} while job {submission_id} ran ({seen}); Ray keeps "
            f"job history in the head pod, so the job's state and logs went with it{spent}. Run `pulumi up` "
            "again: it submits the job afresh on the new head"
        )
    return (
        f"job {submission_id} no longer exists on the Ray head pod {head} ({seen}): "
        f"the Ray head restarted and lost its job history{spent}. Run `pulumi up` again: it submits the job afresh"
    )


def nodes_to_take_out(asked: Sequence[str], taken_out: Collection[str]) -> list[str]:
    """The nodes the job asked to leave it that this run has not taken out yet, once each, in order."""
    return [node for node in dict.fromkeys(asked) if node not in taken_out]


def worker_pods_on(node: str, workers: Sequence[PodFacts]) -> list[PodFacts]:
    """The RayCluster's worker pods on `node` that are not being deleted already."""
    return [pod for pod in workers if pod.node_name == node and not pod.terminating]


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def force_deletion_due(
    pod: PodFacts, node: NodeFacts | None, now: float, wait_s: float = STUCK_TERMINATING_WAIT_S
) -> str | None:
    """Why the Terminating `pod` is to be deleted at once now (`STUCK_TERMINATING_WAIT_S`), or None:
    it is not being deleted; its node is gone (Kubernetes' pod garbage collector removes the pods
    of a deleted Node) or Ready (its kubelet ends the pod); or `wait_s` have not passed since its
    grace ended, or since its node's Ready condition left True. `now` and the facts' times are
    seconds since the epoch."""
    if pod.deleted_at is None or node is None or node.ready:
        return None
    silent_since = node.ready_changed_at
    if now < pod.deleted_at + wait_s or (silent_since is not None and now < silent_since + wait_s):
        return None
    state = {"False": "NotReady", "Unknown": "Unknown (its kubelet stopped reporting)"}.get(
        node.ready_status, "without a Ready condition"
    )
    since = f" since {_utc(silent_since)}" if silent_since is not None else ""
    return (
        f"its node {node.name} is {state}{since} and its grace ended at {_utc(pod.deleted_at)}, "
        f"{(now - pod.deleted_at) / 60:.0f} min ago"
    )


def workers_after(
    ran: Sequence[PodFacts], listed: Sequence[PodFacts], spec_hash: str, taken_out: Collection[str]
) -> list[PodFacts] | None:
    """The worker pods to read a finished job's evidence from: None when none of the pods it started
    on (`ran`) is among those the follower deleted (`taken_out`, by UID); else the live ones listed
    at its end (not being deleted, Ready, of the spec now), the replacements among them."""
    if not any(pod.uid in taken_out for pod in ran):
        return None
    return [pod for pod in listed if not pod.terminating and pod.ready and runs_spec(pod, spec_hash)]


# --- following -------------------------------------------------------------------------------------------


class JobFollower:
    """Follows a run's jobs; `in_flight` is the job started or adopted and not yet seen to end.

    What the run did to keep its jobs alive holds for the whole run (one `pulumi up`): the
    resubmissions it spent, the nodes it took out, the worker pods it deleted (by UID)."""

    def __init__(self, request: RunInputs, env: FollowEnvironment) -> None:
        self.request = request
        self.env = env
        self.in_flight: str | None = None
        self.resubmissions = 0
        self.nodes_taken_out: set[str] = set()
        self.deleted_pods: set[str] = set()  # every worker pod deleted, by UID
        self.force_deleted: set[str] = set()  # those deleted at once (`force_deletion_due`)

    def started(self, submission_id: str) -> None:
        """A job submitted or adopted that has not ended: in flight until `follow_job` sees it end."""
        self.in_flight = submission_id

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

    def follow_job(
        self, pods: RayPods, jobs: RayJobsClient, submission_id: str, resubmit: Resubmit | None = None
    ) -> tuple[JobRecord, JobLog]:
        """Poll until the job ends, logging each step and tending it (module doc); bounded by
        `timeout_minutes` and Ctrl-C. `pods.head` is the head pod at the end, `pods.workers` the
        worker pods its evidence is read from. A job lost with its head is submitted again by
        `resubmit` (None: it cannot be, and the loss ends the run); the job returned, and its log,
        are the submission that ended."""
        log = JobLog()
        offset, status = 0, None
        seen = "not polled yet"
        replaced: str | None = None
        deadline = self.env.clock() + self.request.timeout_minutes * 60
        try:
            while True:
                try:
                    answer = jobs.poll(submission_id, offset)
                    if answer.job is None:
                        refusal = lost_job_refusal(
                            submission_id,
                            pods.head.name,
                            replaced,
                            seen,
                            self.resubmissions,
                            resubmit is not None,
                            self.request.namespace,
                        )
                        if refusal is not None:
                            raise TrainingRunError(refusal)
                        assert resubmit is not None, "refused above: nothing submits it again"
                        self.resubmissions += 1
                        self.resubmitted(resubmit(jobs), submission_id, pods.head.name, replaced)
                        log, offset, status, replaced = JobLog(), 0, None, None
                        seen = "submitted again, not polled yet"
                        continue
                except PodGone as gone:
                    if gone.pod != pods.head.name:
                        raise
                    replaced = pods.head.name
                    pods.head = self.replacement_head(pods.head)
                    self.env.log(f"training run: head pod {replaced} was replaced by {pods.head.name}")
                    jobs = self.jobs_client(pods.head)
                    continue
                job, offset = answer.job, answer.offset
                steps = log.feed(answer.logs)
                if job.status.is_terminal:
                    steps += log.close()
                for step in steps:
                    self.env.log(f"training run {submission_id}: {format_progress_line(step)}")
                listed = self.tend(log, submission_id)
                if job.status != status:
                    status = job.status
                    self.env.log(f"training run: job {submission_id} is {status}")
                if job.status.is_terminal:
                    self.in_flight = None
                    self.read_from_live_workers(pods, listed, submission_id)
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

    def resubmitted(self, run_name: str | None, submission_id: str, head: str, replaced: str | None) -> None:
        """The one line saying a lost job was submitted again."""
        lost = (
            f"head pod {replaced} was replaced by {head}"
            if replaced is not None
            else f"head pod {head} restarted and lost its job history"
        )
        resumes = (
            f" under run name {run_name}: Ray Train resumes it from the run's last committed checkpoint"
            if run_name
            else ""
        )
        self.env.log(
            f"training run: job {submission_id} was lost with the Ray head ({lost}); submitted it again on "
            f"{head}{resumes} (resubmission {self.resubmissions} of at most {MAX_RESUBMISSIONS} a run)"
        )

    # --- tending the job's worker pods, each poll ---------------------------------------------------------

    def tend(self, log: JobLog, submission_id: str) -> list[PodFacts]:
        """One look at the RayCluster's worker pods: take out the nodes the job asked to leave it,
        delete the pods stuck on silent nodes. Returns the pods listed."""
        listed = self.env.cluster.list_pods(
            self.request.namespace, manifests.worker_pod_selector(self.request.ray_cluster_name)
        )
        for node in nodes_to_take_out(log.leaving_nodes, self.nodes_taken_out):
            self.nodes_taken_out.add(node)
            self.take_out(node, listed, submission_id)
        stuck = [pod for pod in listed if pod.deleted_at is not None and pod.uid not in self.force_deleted]
        if stuck:
            nodes = {node.name: node for node in self.env.cluster.list_nodes(GPU_NODE_LABEL_SELECTOR)}
            now = self.env.wall_clock()
            for pod in stuck:
                why = force_deletion_due(pod, nodes.get(pod.node_name or ""), now)
                if why is not None:
                    self.force_deleted.add(pod.uid)
                    self.delete_at_once(pod, why)
        return listed

    def take_out(self, node: str, listed: Sequence[PodFacts], submission_id: str) -> None:
        """Cordon `node`, then delete this RayCluster's worker pods on it with their grace; a line each.
        A node that could not be cordoned keeps its pods: a replacement would land on it again."""
        asked = f"training run: job {submission_id} asks node {node} to leave it (its faults repeat)"
        try:
            found = self.env.cluster.cordon_node(node)
        except ApiUnauthorized as refused:
            self.env.log(
                f"{asked}; cordoning it was refused ({refused}): the stack's identity needs `patch` on nodes "
                "and `delete` on pods. The job's ranks wait for the node, then the run ends; cordon it and "
                "delete its Ray worker pod by hand meanwhile"
            )
            return
        if not found:
            self.env.log(f"{asked}; the node is gone already")
            return
        pods = worker_pods_on(node, listed)
        self.env.log(
            f"{asked}: cordoned it (`kubectl uncordon {node}` undoes it, should it come back under its name)"
            + ("" if pods else f"; no Ray worker pod of {self.request.ray_cluster_name} runs on it")
        )
        for pod in pods:
            try:
                self.env.cluster.delete_pod(self.request.namespace, pod.name)
                self.deleted_pods.add(pod.uid)
            except ApiUnauthorized as refused:
                self.env.log(
                    f"training run: deleting Ray worker pod {pod.name} on node {node} was refused ({refused})"
                )
                continue
            self.env.log(
                f"training run: deleted Ray worker pod {pod.name} on node {node} with its grace (the worker "
                "drains Ray first); KubeRay's replacement pod stays Pending until EKS auto repair replaces "
                "the node"
            )

    def delete_at_once(self, pod: PodFacts, why: str) -> None:
        """Delete a worker pod stuck Terminating (`force_deletion_due`) without its kubelet; a line."""
        try:
            self.env.cluster.delete_pod(self.request.namespace, pod.name, grace_period_seconds=0)
            self.deleted_pods.add(pod.uid)
        except ApiUnauthorized as refused:
            self.env.log(f"training run: deleting the stuck worker pod {pod.name} was refused ({refused})")
            return
        self.env.log(
            f"training run: worker pod {pod.name} on node {pod.node_name} stays Terminating: {why}. Deleted it "
            f"at once (grace 0) after {STUCK_TERMINATING_WAIT_S / 60:.0f} min: KubeRay counts a Terminating "
            "pod as running and creates its replacement only once it is gone"
        )

    def read_from_live_workers(self, pods: RayPods, listed: Sequence[PodFacts], submission_id: str) -> None:
        """At the job's end: its evidence is read from the live worker pods (`workers_after`)."""
        live = workers_after(pods.workers, listed, self.request.run_spec_hash, self.deleted_pods)
        if live is None:
            return
        gone = sorted({pod.name for pod in pods.workers} - {pod.name for pod in live})
        pods.workers = live
        self.env.log(
            f"training run: job {submission_id}: worker pods {', '.join(gone) or 'of its start'} were replaced "
            f"while it ran; its logs are read from {', '.join(pod.name for pod in live) or 'no Ready worker pod'}"
        )
