"""Readiness against a fake Kubernetes API: GPU nodes, pods of the current RayCluster spec, the shipped code."""

from __future__ import annotations

import datetime

import pytest
from kubernetes import client as k8s

from tests.harness.training_run_fakes import (
    CODE_HASH,
    HEAD_POD,
    SPEC_HASH,
    WORKER_PODS,
    FakeCluster,
    failure_of,
    gpu_node,
    main_and_tcp_head,
    props,
    ray_pod,
    run_inputs,
)
from workloads.training_run import readiness
from workloads.training_run.access import cluster_api


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
    # Three polls of the readiness wait; then the GPU nodes listed after the gate's probe, after the job
    # and at the end, for the instances the cost counts.
    assert fake.core.node_calls == 3 + 3 and fake.clock.slept >= 2 * 10


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
    # Four polls of the readiness wait, each listing the head pod (then the workers, which the job's
    # follower lists too).
    assert fake.core.listed["ray.io/cluster=ray-train,ray.io/node-type=head"] == 4
    assert fake.clock.slept >= 3 * 10
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
    facts = [cluster_api._pod_facts(pod) for pod in current]
    head, workers = facts[0], facts[1:]
    assert readiness.pods_waiting_for([head], workers, 2, SPEC_HASH) == []
    assert readiness.pods_waiting_for([head], workers, 2, OLD_SPEC) == [
        "the head pod",
        "2 of 2 worker pods (2 exist)",
    ]
    assert readiness.runs_spec(head, SPEC_HASH) and not readiness.runs_spec(head, OLD_SPEC)
    unmarked = cluster_api._pod_facts(ray_pod(HEAD_POD, "head", spec_hash=None))
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


# What `readiness.HOST_LIMITS_SCRIPT` reads on a node the job cannot run on: the EKS AL2023 NVIDIA AMI's
# older 570 branch (nvidia-smi's header says CUDA 12.8) under an image built for CUDA 13.0, and a
# container runtime that leaves the default 8 MiB locked-memory limit, or the 64 MiB one that
# awslabs/awsome-distributed-ai issue 647 found EFA failing under.
OLD_DRIVER = "driver 570.172.08\ndriver_cuda 12.8\nruntime_cuda 13.0\nmemlock unlimited\n"


def memlock(value: str) -> str:
    """A healthy node's host limits, with this locked-memory limit."""
    return f"driver 580.95.05\ndriver_cuda 13.0\nruntime_cuda 13.0\nmemlock {value}\n"


SMALL_MEMLOCK = memlock("8192")


@pytest.mark.parametrize(
    "read, expected",
    [
        (
            OLD_DRIVER,
            "its node's NVIDIA driver 570.172.08 supports CUDA up to 12.8, but the image's PyTorch is built "
            "for CUDA 13.0, which needs driver 580.65.06 or later",
        ),
        (SMALL_MEMLOCK, "the locked-memory limit is 8192 KiB, under the 4194304 KiB floor"),
        (memlock("65536"), "the locked-memory limit is 65536 KiB, under the 4194304 KiB floor"),
    ],
    ids=["driver", "memlock", "memlock-64MiB"],
)
def test_a_node_the_job_cannot_run_on_stops_before_the_gate_in_one_line(read, expected):
    fake = FakeCluster(main_and_tcp_head())
    fake.workers[WORKER_PODS[1]].host_limits = read
    message = failure_of(fake)
    assert "\n" not in message and message.startswith(f"{WORKER_PODS[1]}: ") and expected in message
    assert "Fix: " in message and WORKER_PODS[0] not in message
    assert fake.head.probe_submissions == [] and fake.head.submissions == []


def test_host_limits_are_judged_on_what_was_read():
    healthy = readiness.HostLimits.parse(
        "driver 580.95.05\ndriver_cuda 13.0\nruntime_cuda 13.1\nmemlock unlimited\n"
    )
    assert healthy == readiness.HostLimits("580.95.05", "13.0", "13.1", "unlimited")
    assert (
        readiness.host_limit_problems("pod", healthy) == []
    )  # a newer minor runs on the same major's driver
    # Nothing read (no nvidia-smi, no torch in the image): nothing judged, never a made-up failure.
    assert (
        readiness.host_limit_problems("pod", readiness.HostLimits.parse("driver \nmemlock unlimited\n")) == []
    )


def test_a_large_finite_memlock_limit_runs_the_job_and_is_noted():
    """Containerd's own limit, which containers inherit, is not documented for the EKS AL2023 AMI: a
    finite one at or over the floor is enough, and the readiness line says it is finite."""
    fake = FakeCluster(main_and_tcp_head())
    fake.workers[WORKER_PODS[1]].host_limits = memlock("68719476736")
    assert fake.provider().create(props(run_inputs())).outs["transport"] == "efa"
    (hosts,) = [line for line in fake.logged if line.startswith("training run: worker pods' hosts: ")]
    assert f"{WORKER_PODS[0]}: driver 580.95.05 (CUDA 13.0), image CUDA 13.0, memlock unlimited" in hosts
    assert (
        f"{WORKER_PODS[1]}: driver 580.95.05 (CUDA 13.0), image CUDA 13.0, memlock 68719476736 KiB (finite, at least the 4194304 KiB floor)"
        in hosts
    )


@pytest.mark.parametrize(
    "value, refused",
    [
        ("unlimited", False),
        (str(readiness.MIN_MEMLOCK_KIB), False),
        (str(readiness.MIN_MEMLOCK_KIB - 1), True),
        ("65536", True),
        ("-1", True),  # not what `ulimit -l` prints: refused, never guessed
    ],
)
def test_the_memlock_floor(value, refused):
    problems = readiness.host_limit_problems("pod", readiness.HostLimits.parse(memlock(value)))
    assert bool(problems) is refused
    assert all(
        p.startswith(f"pod: the locked-memory limit is {value} KiB, under the ") and "Fix: " in p
        for p in problems
    )


def test_a_cpu_job_reads_no_driver():
    assert readiness.uses_gpus(["--preset", "tiny", "--no-use-gpu"]) is False
    assert readiness.uses_gpus(["--no-gpu", "--use-gpu"]) is True and readiness.uses_gpus([]) is False
