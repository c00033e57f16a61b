"""Following a job to its end: its timeout, and what keeps it alive on the way: a driver lost with the
head submitted again under its run name, a node the job asks to leave taken out, a worker pod stuck
Terminating on a silent node deleted at once. The judgements alone, then whole runs in process."""

from __future__ import annotations

import datetime
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness.fake_ray_dashboard import ScriptedJob
from tests.harness.training_run_fakes import (
    EFA_JOB,
    EFA_JOB_TRAFFIC,
    HEAD_POD,
    POD_LOGS,
    WALL_START,
    WORKER_NODES,
    WORKER_PODS,
    FakeCluster,
    FakeRayHead,
    FixturePod,
    driver_log,
    driver_log_with,
    failure_of,
    gpu_node,
    main_and_tcp_head,
    props,
    rank0_line,
    ray_pod,
    run_inputs,
    scripted,
)
from training.metrics.report import format_node_leaving_line
from workloads.training_run.access import cluster_api, jobs
from workloads.training_run.access.cluster_api import NodeFacts, PodFacts
from workloads.training_run.job_following import (
    MAX_RESUBMISSIONS,
    STUCK_TERMINATING_WAIT_S,
    force_deletion_due,
    lost_job_refusal,
    nodes_to_take_out,
    worker_pods_on,
    workers_after,
)
from workloads.training_run.verdicts.evidence import flag_value

NEW_HEAD = "ray-train-head-x7k2p"
# KubeRay's worker pod in place of one deleted, on the node EKS auto repair launched.
REPLACEMENT, REPLACEMENT_NODE = "ray-train-gpu-workers-worker-z9r4t", "node-c"
LEAVING_POD = WORKER_PODS[1]
LEAVING_NODE = WORKER_NODES[LEAVING_POD]


def test_a_job_that_outlives_the_timeout_is_left_running_for_the_next_update():
    head = FakeRayHead({"main": replace(scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING"])})
    fake = FakeCluster(head)
    message = failure_of(fake, run_inputs(timeout_minutes=2))
    assert "still RUNNING after timeout_minutes=2" in message
    assert "the next `pulumi up` waits for it" in message and "ray job stop eks-ray-train-main-" in message
    assert 30 + 120 <= fake.clock.slept <= 30 + 130  # the gate's three polls, then the job's 2 minutes


# --- the judgements ---------------------------------------------------------------------------------


def test_a_lost_job_is_submitted_again_within_the_bound_then_the_loss_ends_the_run_in_one_line():
    args = ("eks-ray-train-main-0a1b", "head-b", "head-a", "RUNNING, step 3/5", 0, True, "ray-train")
    assert [lost_job_refusal(*args[:4], spent, *args[5:]) for spent in range(MAX_RESUBMISSIONS)] == [
        None,
        None,
    ]
    spent = lost_job_refusal(*args[:4], MAX_RESUBMISSIONS, *args[5:])
    assert spent is not None and "\n" not in spent
    assert spent.startswith("head pod head-a was replaced by head-b while job eks-ray-train-main-0a1b ran")
    assert f"submitted again 2 times in this run, the most a run does ({MAX_RESUBMISSIONS})" in spent
    assert "`kubectl -n ray-train describe pod head-b`" in spent
    # Restarted in place (no new pod), or with nothing to submit it again: the loss is the run's end.
    in_place = lost_job_refusal(args[0], "head-b", None, "PENDING", 0, False, "ray-train")
    assert in_place == (
        "job eks-ray-train-main-0a1b no longer exists on the Ray head pod head-b (PENDING): the Ray head "
        "restarted and lost its job history. Run `pulumi up` again: it submits the job afresh"
    )


def test_a_node_is_taken_out_once_a_run_and_only_its_live_worker_pods_are_deleted():
    assert nodes_to_take_out(["node-b", "node-a", "node-b"], set()) == ["node-b", "node-a"]
    assert nodes_to_take_out(["node-b", "node-a"], {"node-b"}) == ["node-a"]
    pods = [
        PodFacts("w-1", "Running", True, "ray-worker", node_name="node-b"),
        PodFacts("w-2", "Running", False, "ray-worker", node_name="node-b", terminating=True),
        PodFacts("w-3", "Running", True, "ray-worker", node_name="node-a"),
    ]
    assert [pod.name for pod in worker_pods_on("node-b", pods)] == ["w-1"]


def _stuck(deleted_at: float) -> PodFacts:
    return PodFacts("w-1", "Running", False, "ray-worker", "node-b", True, deleted_at=deleted_at, uid="u-1")


def _node(ready_status: str, since: float | None) -> NodeFacts:
    return NodeFacts(
        "node-b", {}, {}, ready_status == "True", ready_status=ready_status, ready_changed_at=since
    )


def test_a_pod_stuck_terminating_is_due_for_deletion_only_after_the_wait_past_its_grace_and_its_nodes_silence():
    grace_end, silent = WALL_START, WALL_START - 300.0  # evicted 300 s after the node went silent, 0 s grace
    due = grace_end + STUCK_TERMINATING_WAIT_S
    node = _node("Unknown", silent)
    assert force_deletion_due(_stuck(grace_end), node, due - 1) is None
    why = force_deletion_due(_stuck(grace_end), node, due)
    assert why == (
        "its node node-b is Unknown (its kubelet stopped reporting) since 2026-12-05T08:55:00Z and its grace "
        "ended at 2026-12-05T09:00:00Z, 5 min ago"
    )
    # A node silent for less than the wait holds the pod, however long ago its grace ended.
    assert force_deletion_due(_stuck(grace_end - 3600), _node("False", due - 60), due) is None
    assert "is NotReady since" in (force_deletion_due(_stuck(grace_end), _node("False", silent), due) or "")
    assert (
        force_deletion_due(_stuck(grace_end), _node("True", silent), due + 3600) is None
    )  # its kubelet ends it
    assert force_deletion_due(_stuck(grace_end), None, due + 3600) is None  # the pod GC's, with the Node
    assert force_deletion_due(replace(_stuck(grace_end), deleted_at=None), node, due + 3600) is None


def test_the_evidence_is_read_from_the_live_worker_pods_once_the_follower_took_one_out():
    annotated = {"eks-ray-train/spec-hash": "h"}
    ran = [PodFacts(name, "Running", True, "w", annotations=annotated, uid=name) for name in ("w-1", "w-2")]
    replacement = replace(ran[1], name="w-3", uid="w-3")
    listed = [
        ran[0],
        replace(ran[1], terminating=True),
        replacement,
        replace(replacement, name="w-4", ready=False),
    ]
    assert [pod.name for pod in workers_after(ran, listed, "h", {"w-2"}) or []] == ["w-1", "w-3"]
    # A pod gone without the follower is named where its logs are read: nothing is swapped in.
    assert workers_after(ran, listed, "h", set()) is None


# --- whole runs, in process -------------------------------------------------------------------------

RESUMED_LINE = "resumed from step 2 (s3://checkpoints-0a1b2c3/runs/{run}/checkpoint_000002)"


def resumed_job(run_name: str) -> ScriptedJob:
    """The job submitted again: its rank 0 says it resumed from the run's last checkpoint, and its run
    summary is its own (a rate of its own)."""
    log = driver_log_with(
        driver_log("driver_main.log"), "Attempting to start", [rank0_line(RESUMED_LINE.format(run=run_name))]
    )
    return ScriptedJob(
        EFA_JOB,
        log.replace('"tokens_per_s":530.6', '"tokens_per_s":512.4'),
        ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"],
        efa_traffic=dict(EFA_JOB_TRAFFIC),
    )


def is_main(submission_id: str) -> bool:
    return submission_id.startswith("eks-ray-train-main-")


def test_a_head_replaced_mid_job_has_the_job_submitted_again_under_its_run_name_and_its_outputs():
    head = main_and_tcp_head(statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"])
    fake = FakeCluster(head)
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})

    def polled(submission_id, job):
        if is_main(submission_id) and job.looks == 2 and not fake.former_heads:
            fake.replace_head(NEW_HEAD)  # the system node failed: KubeRay's new head, without job history
            head.jobs_by_variant["main"] = resumed_job(base)

    head.polled = polled
    outs = fake.provider().create(props(run_inputs())).outs
    first, again = head.submissions
    assert flag_value(first[first.index("--") :], "--run-name") == base
    assert flag_value(again[again.index("--") :], "--run-name") == base  # so Ray Train resumes the run
    pods = first.index("--metadata-json") + 1  # the pods the job runs on: the new head among them
    assert again[:pods] == first[:pods] and again[pods + 1 :] == first[pods + 1 :]  # the same command
    assert RESUMED_LINE.format(run=base) in head.jobs[base].driver_log
    assert outs["job_id"] == base and outs["status"] == "SUCCEEDED" and outs["transport"] == "efa"
    assert outs["tokens_per_s"] == 512.4  # the summary of the job that finished
    assert outs["efa_bytes"] == dict.fromkeys(WORKER_PODS, 38_654_709_760)  # counted around the new one
    assert f"training run: head pod {HEAD_POD} was replaced by {NEW_HEAD}" in fake.logged
    lines = [line for line in fake.logged if "was lost with the Ray head" in line]
    assert lines == [
        f"training run: job {base} was lost with the Ray head (head pod {HEAD_POD} was replaced by {NEW_HEAD}); "
        f"submitted it again on {NEW_HEAD} under run name {base}: Ray Train resumes it from the run's last "
        f"committed checkpoint (resubmission 1 of at most {MAX_RESUBMISSIONS} a run)"
    ]


def test_a_head_restarted_in_place_has_the_job_submitted_again():
    head = main_and_tcp_head(statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"])
    fake = FakeCluster(head)
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    restarted: list[str] = []

    def polled(submission_id, job):
        if is_main(submission_id) and job.looks == 2 and not restarted:
            restarted.append(submission_id)
            head.forget()  # the head container restarted: a new GCS, the same pod
            head.jobs_by_variant["main"] = resumed_job(base)

    head.polled = polled
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["status"] == "SUCCEEDED" and len(head.submissions) == 2
    assert any(f"(head pod {HEAD_POD} restarted and lost its job history)" in line for line in fake.logged)


def test_a_third_loss_of_the_head_in_one_run_ends_it_in_one_line():
    head = main_and_tcp_head(statuses=["PENDING", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"])
    fake = FakeCluster(head)
    heads = iter(["ray-train-head-aaaaa", "ray-train-head-bbbbb", "ray-train-head-ccccc"])

    def polled(submission_id, job):
        if is_main(submission_id) and job.looks == 2:
            fake.replace_head(next(heads))
            head.jobs_by_variant["main"] = replace(job, looks=0)

    head.polled = polled
    message = failure_of(fake)
    assert len(head.submissions) == 1 + MAX_RESUBMISSIONS
    assert message.startswith("head pod ray-train-head-bbbbb was replaced by ray-train-head-ccccc while job ")
    assert "submitted again 2 times in this run, the most a run does (2)" in message and "\n" not in message


def test_a_node_the_job_asks_to_leave_is_cordoned_and_its_worker_pod_deleted_once():
    """Rank 0 asks twice (its line after step 2, again after step 4): one cordon, one delete. The pod
    ends after its drain and KubeRay's replacement runs on the node auto repair launched; the job
    finishes on it and its logs are read there. (The replacement's EFA counters were not read before
    the job, so the counter check is off here.)"""
    why = f"two faults in a row on node {LEAVING_NODE} (the last: Xid 79): waiting up to 1800 s"
    leaving = rank0_line(format_node_leaving_line(LEAVING_NODE, why, 1800))
    log = driver_log_with(driver_log("driver_main.log"), "step 2/5", [leaving])
    log = driver_log_with(log, "step 4/5", [leaving])
    head = main_and_tcp_head(driver_log=log, statuses=["PENDING", *["RUNNING"] * 6, "SUCCEEDED"])
    fake = FakeCluster(head)
    fake.core.node_snapshots = [[gpu_node("node-a"), gpu_node("node-b"), gpu_node(REPLACEMENT_NODE)]]
    own = tempfile.TemporaryDirectory(prefix="tmp-ray-")

    def kubelet(pod, grace):  # the pod ends after its drain; KubeRay creates its replacement
        for pods in fake.core.pod_snapshots:
            pods[:] = [p for p in pods if p.metadata.name != pod.metadata.name]
            pods.append(ray_pod(REPLACEMENT, "worker", node=REPLACEMENT_NODE))
        fake.workers[REPLACEMENT] = FixturePod(
            REPLACEMENT, logs=POD_LOGS / LEAVING_POD / "logs", nccl_logs=Path(own.name)
        )

    fake.core.deleted = kubelet
    outs = fake.provider().create(props(run_inputs(check_efa_counters=False))).outs
    assert fake.core.patches == [
        (LEAVING_NODE, {"spec": {"unschedulable": True}}, cluster_api.STRATEGIC_MERGE_PATCH)
    ]
    assert fake.core.deletions == [("ray-train", LEAVING_POD, None)]  # with the pod's own grace
    asked = [line for line in fake.logged if f"asks node {LEAVING_NODE} to leave it" in line]
    assert len(asked) == 1 and f"cordoned it (`kubectl uncordon {LEAVING_NODE}`" in asked[0]
    deleted = [line for line in fake.logged if "deleted Ray worker pod" in line]
    assert deleted == [
        f"training run: deleted Ray worker pod {LEAVING_POD} on node {LEAVING_NODE} with its grace (the worker "
        "drains Ray first); KubeRay's replacement pod stays Pending until EKS auto repair replaces the node"
    ]
    assert outs["status"] == "SUCCEEDED" and outs["transport"] == "efa"
    assert sorted(outs["worker_log_files"]) == sorted([WORKER_PODS[0], REPLACEMENT])
    assert any(f"worker pods {LEAVING_POD} were replaced while it ran" in line for line in fake.logged)


def test_a_worker_pod_stuck_terminating_on_a_silent_node_is_deleted_at_once_after_the_wait_not_before():
    """Mid-job node-b's kubelet falls silent; 300 s later the taint manager evicts its worker pod with
    the pod's 90 s grace, and the pod stays Terminating. It is deleted at once (grace 0) at the first
    poll 5 minutes past both, and KubeRay's replacement (on the node auto repair launched) finishes
    the job."""
    head = main_and_tcp_head(statuses=["PENDING", *["RUNNING"] * 60, "SUCCEEDED"])
    fake = FakeCluster(head)
    own = tempfile.TemporaryDirectory(prefix="tmp-ray-")
    stuck: dict[str, float] = {}

    def at(seconds: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC)

    def polled(submission_id, job):
        pods = fake.core.pod_snapshots[-1]
        if is_main(submission_id) and job.looks == 3 and not stuck:
            now = fake.clock.wall()
            stuck.update(silent=now - 300, grace_end=now + 90)
            (pod,) = [p for p in pods if p.metadata.name == LEAVING_POD]
            pod.metadata.deletion_timestamp = at(stuck["grace_end"])
            fake.core.node_snapshots = [
                [
                    gpu_node("node-a"),
                    gpu_node("node-b", ready_status="Unknown", ready_since=at(stuck["silent"])),
                ]
            ]
            fake.core.node_calls = 0
        if stuck and not any(p.metadata.name in (LEAVING_POD, REPLACEMENT) for p in pods):
            pods.append(ray_pod(REPLACEMENT, "worker", node=REPLACEMENT_NODE))  # KubeRay's replacement
            fake.workers[REPLACEMENT] = FixturePod(
                REPLACEMENT, logs=POD_LOGS / LEAVING_POD / "logs", nccl_logs=Path(own.name)
            )

    head.polled = polled
    deletions: list[tuple[str, int | None, float]] = []
    delete = fake.core.delete_namespaced_pod

    def timed_delete(name, namespace, grace_period_seconds=None, **options):
        deletions.append((name, grace_period_seconds, fake.clock.wall()))
        return delete(name, namespace, grace_period_seconds, **options)

    fake.core.delete_namespaced_pod = timed_delete
    outs = fake.provider().create(props(run_inputs(check_efa_counters=False))).outs
    due = max(stuck["grace_end"], stuck["silent"]) + STUCK_TERMINATING_WAIT_S
    ((name, grace, when),) = deletions
    assert (name, grace) == (LEAVING_POD, 0)
    assert due <= when < due + 10  # at the first poll due (every 10 s), not before
    (line,) = [line for line in fake.logged if "stays Terminating" in line]
    assert line.startswith(
        f"training run: worker pod {LEAVING_POD} on node node-b stays Terminating: its node node-b is Unknown"
    )
    assert "Deleted it at once (grace 0) after 5 min" in line
    assert outs["status"] == "SUCCEEDED" and sorted(outs["worker_log_files"]) == sorted(
        [WORKER_PODS[0], REPLACEMENT]
    )


@pytest.mark.parametrize("refused", ["cordon", "delete"])
def test_a_refused_write_is_said_in_a_line_and_the_job_followed_on(refused):
    """A stack identity without `patch` on nodes (or `delete` on pods): the follower says so and goes
    on following; a node it could not cordon keeps its pod, or a replacement would land there again."""
    leaving = rank0_line(format_node_leaving_line(LEAVING_NODE, "two faults in a row", 1800))
    head = main_and_tcp_head(driver_log=driver_log_with(driver_log("driver_main.log"), "step 2/5", [leaving]))
    fake = FakeCluster(head)

    def forbidden(*args, **kwargs):
        raise ApiException(status=403, reason="Forbidden")

    if refused == "cordon":
        fake.core.patch_node = forbidden
    else:
        fake.core.delete_namespaced_pod = forbidden
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["status"] == "SUCCEEDED"
    refusals = [line for line in fake.logged if "refused" in line and LEAVING_NODE in line]
    assert len(refusals) == 1
    if refused == "cordon":
        assert "needs `patch` on nodes and `delete` on pods" in refusals[0] and fake.core.deletions == []
