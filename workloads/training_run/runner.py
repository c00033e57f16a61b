"""One run of the TrainingRun resource: readiness, the gate, the job(s), the verdict(s), the outputs.

First the deadline: a job's `--deadline` that leaves no room for the fabric gate and one step with
its checkpoint stops the run before anything is scaled or submitted (`deadline.window_problem`).

The steps, each in its own module: wait for a Capacity Block's start when it has not begun
(`not_before`), then until the cluster is ready (`readiness`); run the fabric
probe on the job's worker group with the job's NCCL environment and judge it (`gate`): a fabric
that fails stops the run before the job is submitted; adopt or submit the job and follow it to
its end (`jobs`), read its logs and judge NCCL's transport (`evidence`). With `benchmark` the same
gate and job then run with NCCL forced onto TCP (`TCP_BASELINE_ENV`), that run must really have
used sockets, and both throughputs and their ratio are output. A wait cut short by Ctrl-C or by
`timeout_minutes` leaves the job running: the next `pulumi up` adopts it.

With `gpuNodesAfterTraining: release` the run owns the GPU node group's desired size
(`gpu_node_group`): out before the readiness wait, to 0 once every job it started or followed has
ended (`released_at`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import pulumi

from platform_contract import EFA_RESOURCE, GPU_RESOURCE
from workloads import manifests
from workloads.nccl_transport import classify_lines
from workloads.training_run import deadline, gpu_node_group, node_hours, readiness
from workloads.training_run.access import efa_counter_reads
from workloads.training_run.access.cluster_api import ClusterApi, NodeFacts, PodFacts
from workloads.training_run.access.commands import Executor
from workloads.training_run.access.ec2_instances import LaunchTimes, no_launch_times
from workloads.training_run.access.jobs import (
    DASHBOARD_ADDRESS,
    NCCL_LOG_DIR,
    JobStatus,
    RayJobsClient,
    SubmissionChoice,
    choose_submission,
    submission_id_base,
    submit_command,
)
from workloads.training_run.access.node_group import NodeGroupSizer
from workloads.training_run.attempts import attempt_line, restarts_of
from workloads.training_run.errors import (
    ApiRefused,
    ApiUnauthorized,
    ApiUnreachable,
    Interrupted,
    PodGone,
    TrainingRunError,
)
from workloads.training_run.job_following import JobFollower
from workloads.training_run.node_hours import GpuNodeLaunches
from workloads.training_run.readiness import Pace, RayPods
from workloads.training_run.schema import RELEASE, RunInputs, RunTimings
from workloads.training_run.verdicts import efa_counters, evidence, fabric, gate
from workloads.training_run.verdicts.evidence import JobLog, JobResult
from workloads.training_run.verdicts.gate import GateResult

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
READER_WAIT_S = 120.0  # for an EFA counter reader pod that cannot be read yet (`read_counters`)
GATE_VARIANT = "gate"  # the fabric probe before a job: `gate-main`, `gate-tcp`


@dataclass
class RunEnvironment:
    """Where and how a run talks to the cluster; the provider's `connect_to_eks` builds the real one.

    The end-to-end test builds one over a local Ray head: `KubernetesCluster` over a fake
    Kubernetes API, `LocalExecutor`s, and the local dashboard, session log folder and code folder.
    """

    cluster: ClusterApi
    executor_for: Callable[[PodFacts], Executor]
    dashboard_address: str = DASHBOARD_ADDRESS
    code_dir: str = manifests.CODE_MOUNT
    ray_log_dir: str = evidence.RAY_LOG_DIR
    nccl_log_dir: str = NCCL_LOG_DIR
    log: Callable[[str], None] = pulumi.log.info
    poll_interval_s: float = RunTimings().poll_interval_s
    readiness_timeout_s: float = RunTimings().readiness_timeout_s
    code_sync_timeout_s: float = RunTimings().code_sync_timeout_s
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # The GPU node group's size, for `gpuNodesAfterTraining: release` (None: nothing to size).
    node_group: NodeGroupSizer | None = None
    # What EC2 says of the GPU nodes' instances, by id (`ec2_instances`): the run's cost counts from it.
    launch_times: LaunchTimes = no_launch_times
    # Seconds since the epoch, against AWS's dates (a Capacity Block's start, the nodes' launch) and
    # dating the outputs; `clock` measures spans.
    wall_clock: Callable[[], float] = time.time

    @property
    def pace(self) -> Pace:
        return Pace(self.poll_interval_s, self.clock, self.sleep)


class TrainingRunner:
    """One run of the resource: checks, job(s), verdict(s), outputs; its `follower` follows each job
    to its end and knows which one is in flight."""

    # Failures after which this run cannot tell whether a job still runs on the GPU nodes.
    UNSURE = (Interrupted, ApiUnreachable, ApiUnauthorized, ApiRefused)

    def __init__(self, request: RunInputs, env: RunEnvironment) -> None:
        self.request = request
        self.env = env
        self.follower = JobFollower(request, env)
        self.released_at: str | None = None  # when EKS accepted the GPU group's scale-down to 0
        # Every GPU node the run saw, by providerID (`see_gpu_nodes`): the instances its hours count.
        self.gpu_nodes: dict[str, NodeFacts] = {}

    def start_job(
        self,
        pods: RayPods,
        jobs: RayJobsClient,
        variant: str,
        env_vars: Mapping[str, str],
        module: str = "training",
        args: Sequence[str] | None = None,
        fresh: bool = False,
    ) -> SubmissionChoice:
        """Adopt the job these inputs already started (`choose_submission`), or submit it with the EFA
        counters read just before it recorded beside it first. A `fresh` job (the gate's probe) is never
        judged again: one an earlier run left running is waited for, then a new one is submitted."""
        args = self.request.job_args if args is None else args
        base = submission_id_base(self.request.job_identity(), variant, env_vars)
        choice = choose_submission(jobs.list(base), base, pods.identity(), rejudge=not fresh)
        if fresh and choice.adopted is not None:
            self.env.log(
                f"training run: probe {choice.submission_id} ({choice.adopted.status}), started by an earlier run, "
                "is waited for; then a fresh probe runs"
            )
            self.follower.follow_job(pods, jobs, choice.submission_id)
            choice = choose_submission(jobs.list(base), base, pods.identity(), rejudge=False)
        if choice.note:
            self.env.log(f"training run: {choice.note}")
        if choice.adopted is not None:
            self.env.log(
                f"training run: following job {choice.submission_id} ({choice.adopted.status}), started by an earlier run"
            )
            if not choice.adopted.status.is_terminal:
                self.follower.started(choice.submission_id)
            return choice
        self.submit_job(pods, jobs, choice.submission_id, args, env_vars, module)
        self.env.log(
            f"training run: submitted job {choice.submission_id}: python -m {module} {' '.join(args)}"
        )
        return choice

    def submit_job(
        self,
        pods: RayPods,
        jobs: RayJobsClient,
        submission_id: str,
        args: Sequence[str],
        env_vars: Mapping[str, str],
        module: str,
    ) -> str | None:
        """Submit the job under `submission_id` with the EFA counters read just before it recorded
        beside it: a first submission, or one Ray lost with its head submitted again on the new head
        (`follow_job`), by the same command (`jobs.submit_command`), so under the same run name.
        Returns that run name (None: a job without one, the fabric probe)."""
        # Recorded before the job exists: a submit that is cut off leaves no job without its record.
        jobs.write_record(submission_id, {"efa_before": self.read_counters(pods)})
        self.follower.started(submission_id)
        jobs.submit(submission_id, self.env.code_dir, args, env_vars, pods.identity(), module)
        command = submit_command(
            self.env.dashboard_address, submission_id, self.env.code_dir, args, env_vars, "", module=module
        )
        return evidence.flag_value(command[command.index("--") + 1 :], "--run-name")

    def read_counters(self, pods: RayPods) -> efa_counter_reads.Readings:
        """Each worker node's EFA counters now, or why not. A node whose read failed is asked again,
        with the reader pods listed afresh, for as long as `READER_WAIT_S` (at most the readiness
        wait): a reader pod starts with its node, and the DaemonSet replaces every reader when its
        command (the source of `efa_sysfs.py`) or the image changes, which `pulumi up` does not wait
        for (`efa_counter_reader.SKIP_AWAIT`). With the counter check off they are read once: no
        verdict waits on them."""
        found: efa_counter_reads.Readings = {}

        def attempt() -> tuple[bool, efa_counter_reads.Readings]:
            unread = [pod for pod in pods.workers if isinstance(found.get(pod.name, ""), str)]
            found.update(efa_counter_reads.read_counters(self.env.cluster, unread, self.env.executor_for))
            return not any(isinstance(read, str) for read in found.values()), found

        wait_s = min(READER_WAIT_S, self.env.readiness_timeout_s) if self.request.check_efa_counters else 0
        self.env.pace.until(wait_s, attempt)
        return found

    def job_traffic(self, pods: RayPods, jobs: RayJobsClient, submission_id: str) -> efa_counters.EfaTraffic:
        """The EFA traffic of a job that has ended: what was recorded when it was judged, else the
        counters now against those recorded before it, recorded with it."""
        record = jobs.read_record(submission_id) or {}
        if "efa_traffic" in record:
            return efa_counters.traffic_from_record(record["efa_traffic"])
        if "efa_before" not in record:
            return efa_counters.unavailable_traffic(
                [pod.name for pod in pods.workers],
                "the job was submitted without its counters recorded before it",
            )
        traffic = efa_counters.efa_traffic(record["efa_before"], self.read_counters(pods))
        jobs.write_record(submission_id, {**record, "efa_traffic": efa_counters.traffic_record(traffic)})
        return traffic

    def judged_run(
        self,
        pods: RayPods,
        variant: str,
        env_vars: Mapping[str, str],
        module: str = "training",
        args: Sequence[str] | None = None,
        fresh: bool = False,
    ) -> tuple[JobResult, JobLog]:
        """Run a job (the training job or the probe) to its end and judge it: NCCL's transport from
        its lines, covering the job's ranks and worker pods, and the EFA counters around it. Its
        `summary` is left empty for the caller to read from the log."""
        jobs = self.follower.jobs_client(pods.head)
        choice = self.start_job(pods, jobs, variant, env_vars, module, args, fresh)
        submission_id = choice.submission_id
        job_args = self.request.job_args if args is None else args

        def resubmit(on: RayJobsClient) -> str | None:  # a job lost with its head, on the new head
            return self.submit_job(pods, on, submission_id, job_args, env_vars, module)

        job, log = self.follower.follow_job(pods, jobs, submission_id, resubmit)
        jobs = self.follower.jobs_client(pods.head)  # the head may have been replaced meanwhile
        self.see_gpu_nodes(self.env.cluster.list_nodes(readiness.GPU_NODE_LABEL_SELECTOR))
        if job.status != JobStatus.SUCCEEDED:
            raise TrainingRunError(
                evidence.failure_report(job, log, pods.workers, self.env.executor_for, self.env.ray_log_dir)
            )
        ray_job_id = (
            job.ray_job_id if job.ray_job_id and evidence.RAY_JOB_ID.fullmatch(job.ray_job_id) else None
        )
        worker_logs = evidence.worker_logs(
            pods.workers,
            self.env.executor_for,
            evidence.nccl_lines_command(
                self.env.nccl_log_dir, submission_id, self.env.ray_log_dir, ray_job_id
            ),
            self.env.ray_log_dir,
        )
        lines = [line for read in worker_logs.values() for line in read.lines] + log.nccl_lines
        ranks, hosts = evidence.expected_coverage(
            self.request.job_args, self.request.gpus_per_node, len(pods.workers)
        )
        verdict = classify_lines(lines).covering(ranks, hosts)
        log_files = {pod: read.files for pod, read in worker_logs.items()}
        kind = (
            "NCCL log files" if any(read.nccl_files for read in worker_logs.values()) else "Ray worker logs"
        )
        self.env.log(
            f"training run: job {submission_id}: NCCL transport {verdict.transport} ({verdict.reason}); "
            f"{kind} read: {log_files}"
        )
        rejudged = choice.note if choice.adopted is not None and choice.adopted.status.is_terminal else None
        traffic = self.job_traffic(pods, jobs, submission_id)
        self.env.log(
            f"training run: job {submission_id}: EFA bytes per worker pod {traffic.bytes_moved()}"
            + (f" ({note})" if (note := traffic.unavailable_note()) else "")
        )
        return JobResult(submission_id, job.status, {}, verdict, log_files, rejudged, traffic), log

    def run_job(self, pods: RayPods, variant: str, env_vars: Mapping[str, str]) -> JobResult:
        result, log = self.judged_run(pods, variant, env_vars)
        summary = log.summary()
        if summary is None:
            raise TrainingRunError(
                f"job {result.submission_id} succeeded but its log ends without the run summary (a JSON line "
                f"with world_size, steps, tokens_per_s, ...); last lines:\n" + "\n".join(log.last_lines())
            )
        self.env.log(f"training run: job {result.submission_id}: {summary.get('tokens_per_s')} tokens/s")
        for attempt in restarts_of(summary).attempts or []:
            self.env.log(attempt_line(result.submission_id, attempt))
        return replace(result, summary=summary)

    def run_gate(
        self, pods: RayPods, variant: str, env_vars: Mapping[str, str], ready_at: float, fresh: bool = True
    ) -> GateResult:
        """The fabric probe on the job's worker group, with the job's NCCL environment, judged
        (`gate`); a pod that vanishes meanwhile stops the run saying so. Not `fresh`: the probe that
        passed before the job now in flight, judged by the counters recorded when it ran."""
        args = fabric.probe_args(self.request.job_args)
        try:
            result, log = self.judged_run(
                pods, f"{GATE_VARIANT}-{variant}", env_vars, fabric.PROBE_MODULE, args, fresh
            )
        except PodGone as gone:
            raise TrainingRunError(
                f"pod {gone.pod} vanished during the fabric gate ({gone.what} answered 404), so the training "
                f"job was not submitted. Run `pulumi up` again once the RayCluster's pods are Ready again "
                f"(`kubectl -n {self.request.namespace} get pods`): the gate then runs on the new pods"
            ) from gone
        report = fabric.probe_report(log.last_lines(JobLog.TAIL_LINES))
        if report is None:
            raise TrainingRunError(
                f"fabric probe {result.submission_id} succeeded but its log ends without its JSON line "
                "(world_size, results); last lines:\n" + "\n".join(log.last_lines())
            )
        probe = fabric.probe_result(result.submission_id, report, len(pods.workers))
        seconds = round(self.env.clock() - ready_at, 1)
        self.env.log(
            f"training run: fabric gate {result.submission_id}: busbw at {probe.largest_bytes} bytes "
            f"{fabric.busbw_reading(probe.busbw_gbps, self.request.line_rate_gbps)}; verdict "
            f"{seconds} s after the pods were ready"
        )
        return GateResult(replace(result, summary=report), probe, seconds)

    def wait_for_the_block(self) -> None:
        """Until `not_before`, a Capacity Block's start: its GPU nodes cannot launch before it (EKS
        user guide, "Create a managed node group with Capacity Blocks for ML"). A line each poll."""
        if self.request.not_before is None:
            return
        start = datetime.datetime.fromisoformat(self.request.not_before).timestamp()
        while (left := start - self.env.wall_clock()) > 0:
            self.env.log(
                f"training run: waiting for the Capacity Block's start at {self.request.not_before} "
                f"({left / 60:.1f} min left); its GPU nodes launch then"
            )
            self.env.sleep(min(self.env.poll_interval_s, left))

    def wait_until_ready(self) -> RayPods:
        request, env = self.request, self.env
        worker_pods = env.cluster.ray_cluster_worker_count(request.namespace, request.ray_cluster_name)
        nodes = readiness.wait_for_gpu_nodes(
            env.cluster,
            env.pace,
            env.readiness_timeout_s,
            request.gpus_per_node,
            request.efa_per_node,
            worker_pods,
            self.see_gpu_nodes,
        )
        env.log(
            f"training run: {len(nodes)} GPU nodes ready ({request.gpus_per_node} {GPU_RESOURCE}, "
            f">= {request.efa_per_node} {EFA_RESOURCE} each)"
        )
        pods = readiness.wait_for_pods(
            env.cluster,
            env.pace,
            env.readiness_timeout_s,
            request.namespace,
            request.ray_cluster_name,
            worker_pods,
            request.run_spec_hash,
        )
        env.log(
            f"training run: head pod {pods.head.name} and {len(pods.workers)} worker pods Ready, "
            f"all of RayCluster spec {request.run_spec_hash}"
        )
        readiness.wait_for_code(
            env.executor_for(pods.head),
            pods.head.name,
            env.pace,
            env.code_sync_timeout_s,
            env.code_dir,
            request.code_hash,
        )
        if readiness.uses_gpus(request.job_args):
            read = readiness.check_host_limits(pods.workers, env.executor_for)
            env.log(f"training run: worker pods' hosts: {'; '.join(read)}")
        return pods

    def gated_job(
        self,
        pods: RayPods,
        variant: str,
        env_vars: Mapping[str, str],
        expect: str,
        ready_at: float,
        job_floor: efa_counters.MovedFloor | None,
    ) -> tuple[GateResult, JobResult]:
        """The gate, then (only when it passed) the job, then the job's own verdict, its EFA
        counters held to `job_floor` (None: not judged).

        The gate runs a fresh probe, unless an earlier run's job of these inputs is still pending or
        running on these pods: a probe beside it would share its GPUs, and it was submitted only
        after its own gate passed, whose recorded verdict then stands. A job of these inputs that
        ended while no `pulumi up` watched it has its counters read now, before the probe moves them:
        nothing else used EFA since, unless something outside this stack did."""
        request = self.request
        base = submission_id_base(request.job_identity(), variant, env_vars)
        jobs = self.follower.jobs_client(pods.head)
        earlier = choose_submission(jobs.list(base), base, pods.identity()).adopted
        fresh = earlier is None or earlier.status.is_terminal
        if earlier is not None and not fresh:
            self.env.log(
                f"training run: job {earlier.submission_id} is {earlier.status}: the gate that passed before it "
                "stands, no probe runs beside it"
            )
        elif earlier is not None:
            self.job_traffic(pods, jobs, earlier.submission_id)
        passed = self.run_gate(pods, variant, env_vars, ready_at, fresh)
        check = request.check_efa_counters
        gate.check_gate(passed, expect, request.line_rate_gbps, request.min_busbw_fraction, check)
        job = self.run_job(pods, variant, env_vars)
        evidence.check_transport(job, expect, job_floor if check else None)
        return passed, job

    def run(self) -> tuple[tuple[GateResult, JobResult], tuple[GateResult, JobResult] | None]:
        """The gated job(s); with `release`, the GPU nodes scaled out before and released after (module
        doc). First of all, the deadline's room (`window_problem`)."""
        now = datetime.datetime.fromtimestamp(self.env.wall_clock(), datetime.UTC)
        problem = deadline.window_problem(
            self.request.job_args, self.request.deadline_check, now, self.request.not_before
        )
        if problem:
            raise TrainingRunError(problem)
        sizer = self.env.node_group if self.request.gpu_nodes_after_training == RELEASE else None
        if sizer is None:
            return self.gated_jobs()
        try:
            result = self.gated_jobs(sizer)
        except TrainingRunError as error:
            in_flight = self.follower.in_flight
            if in_flight is None and not isinstance(error, self.UNSURE):
                try:  # every job ended: the failure is the verdict, and the nodes idle
                    self.released_at = self.release(sizer)
                except TrainingRunError as failed:
                    self.env.log(f"training run: the GPU nodes were not scaled to 0: {failed}")
            else:
                running = f"job {in_flight} still runs" if in_flight else "a job may still run"
                self.env.log(
                    f"training run: the GPU nodes keep running (gpuNodesAfterTraining: release): {running} on them; "
                    "the next `pulumi up` that sees it end scales them to 0"
                )
            raise
        self.released_at = self.release(sizer)
        return result

    def release(self, sizer: NodeGroupSizer) -> str | None:
        return gpu_node_group.release_gpu_nodes(
            sizer, self.env.pace, self.env.readiness_timeout_s, self.gpu_node_count, self.env.log
        )

    @property
    def gpu_node_count(self) -> int:
        count = self.request.gpu_node_count
        assert count is not None, "checked: gpu_node_count is required with release"
        return count

    def gated_jobs(
        self, sizer: NodeGroupSizer | None = None
    ) -> tuple[tuple[GateResult, JobResult], tuple[GateResult, JobResult] | None]:
        """The main gate and job, checked; then the TCP baseline's when benchmarking."""
        try:
            self.wait_for_the_block()
            if sizer is not None:
                gpu_node_group.scale_gpu_nodes_up(
                    sizer,
                    self.env.pace,
                    self.env.readiness_timeout_s,
                    self.gpu_node_count,
                    (self.request.cluster_name, self.request.region),
                    self.env.log,
                    block_began=self.request.not_before is not None,
                )
            pods = self.wait_until_ready()
        except Interrupted:
            raise Interrupted("interrupted while waiting for the cluster; no job was submitted") from None
        if not self.request.check_efa_counters:
            self.env.log(
                "training run: the EFA counter check is off (training.checkEfaCounters: false): the counters are "
                "read and reported, and no verdict rests on them"
            )
        expect = self.request.expect_transport
        main_floor = efa_counters.ANY_TRAFFIC if expect == "efa" else None
        main = self.gated_job(pods, MAIN_VARIANT, {}, expect, self.env.clock(), main_floor)
        if not self.request.benchmark:
            return main, None
        efa_run = main[1].efa
        tcp_floor = efa_counters.baseline_floor(efa_run) if efa_run is not None else None
        return main, self.gated_job(
            pods, TCP_VARIANT, TCP_BASELINE_ENV, "socket", self.env.clock(), tcp_floor
        )

    def see_gpu_nodes(self, nodes: list[NodeFacts]) -> None:
        """Record the GPU nodes listed now: every readiness poll, after each job and at the end, so an
        instance replaced during the run, or one that never became Ready, is counted too."""
        self.gpu_nodes.update({node.provider_id or node.name: node for node in nodes})

    def gpu_node_launches(self) -> GpuNodeLaunches:
        """What EC2 says of every GPU node's instance the run saw, read after the job: the run's cost
        counts node hours from it. A node without an instance id, or EC2 refusing DescribeInstances,
        makes them unavailable with the reason; an instance EC2 does not list is named in its record."""
        self.see_gpu_nodes(self.env.cluster.list_nodes(readiness.GPU_NODE_LABEL_SELECTOR))
        nodes, unavailable = node_hours.launches(self.gpu_nodes.values(), self.env.launch_times)
        if unavailable:
            self.env.log(f"training run: the GPU nodes' launch times are unavailable: {unavailable}")
        finished = datetime.datetime.fromtimestamp(self.env.wall_clock(), datetime.UTC)
        return GpuNodeLaunches(nodes, unavailable, finished.isoformat())
