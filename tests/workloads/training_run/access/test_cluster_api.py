"""The cluster queries: a REST answer that may pass asked again until the attempts are spent, a\nread in each pod; the facts read off nodes and pods; the follower's cordon and deletes."""

from __future__ import annotations

import base64
import datetime
import threading
import types

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness import fake_kube_api
from tests.harness.training_run_fakes import FakeCoreApi, gpu_node, ray_pod
from workloads.training_run import errors
from workloads.training_run.access import call_bounds, cluster_api
from workloads.training_run.access.cluster_api import KubernetesCluster
from workloads.training_run.access.commands import ExecResult


def test_a_rest_answer_that_may_pass_is_asked_again_until_the_attempts_are_spent():
    calls = []

    def list_node(label_selector, **_):
        calls.append(label_selector)
        raise ApiException(status=429, reason="Too Many Requests")

    core = types.SimpleNamespace(list_node=list_node)
    cluster = KubernetesCluster(core, None, timeouts=call_bounds.ApiTimeouts(attempts=3, backoff_s=0.001))
    with pytest.raises(errors.ApiRefused, match=r"answered 429 to listing nodes.*3 attempts"):
        cluster.list_nodes("role=gpu-worker")
    assert len(calls) == 3 and not cluster.accepted
    cancelled = threading.Event()
    cancelled.set()
    cluster = KubernetesCluster(core, None, cancelled=cancelled)
    with pytest.raises(errors.Interrupted):
        cluster.list_nodes("role=gpu-worker")


class _Answers:
    """An executor that answers each pod with a fixed result, as `PodExecutor.run` returns one."""

    def __init__(self, result: ExecResult):
        self.result = result

    def run(self, argv, timeout_s):
        return self.result


def test_a_read_in_each_pod_gives_each_stdout_or_names_the_pod_that_failed():
    """The EFA counters and the Ray logs are read this way from every worker pod."""
    pods = [cluster_api.PodFacts(name, "Running", True, "ray-worker") for name in ("worker-a", "worker-b")]
    listings = cluster_api.stdout_of_each_pod(
        pods, lambda pod: _Answers(ExecResult(0, f"from {pod.name}\n")), ["cat", "x"], "x"
    )
    assert listings == {"worker-a": "from worker-a\n", "worker-b": "from worker-b\n"}
    failing = {"worker-a": ExecResult(0, "ok\n"), "worker-b": ExecResult(2, "", "cat: x: No such file")}
    with pytest.raises(errors.TrainingRunError) as raised:
        cluster_api.stdout_of_each_pod(
            pods, lambda pod: _Answers(failing[pod.name]), ["cat", "x"], "the file x"
        )
    assert str(raised.value) == (
        "reading the file x of worker pod worker-b failed (exit 2): cat: x: No such file"
    )


def test_a_nodes_ready_condition_and_a_pods_deletion_are_read_with_their_times():
    silent = datetime.datetime(2026, 12, 5, 8, 55, tzinfo=datetime.UTC)
    grace_end = datetime.datetime(2026, 12, 5, 9, 1, 30, tzinfo=datetime.UTC)
    core = FakeCoreApi(
        [[gpu_node("node-a"), gpu_node("node-b", ready_status="Unknown", ready_since=silent)]],
        [[ray_pod("w-1", "worker", node="node-b", deleted_at=grace_end), ray_pod("w-2", "worker")]],
    )
    cluster = KubernetesCluster(core, None)
    node_a, node_b = cluster.list_nodes("role=gpu-worker")
    assert (node_a.ready, node_a.ready_status, node_a.ready_changed_at, node_a.unschedulable) == (
        True,
        "True",
        None,
        False,
    )
    assert (node_b.ready, node_b.ready_status, node_b.ready_changed_at) == (
        False,
        "Unknown",
        silent.timestamp(),
    )
    stuck, running = cluster.list_pods("ray-train", "ray.io/node-type=worker")
    assert (stuck.terminating, stuck.deleted_at, stuck.node_name) == (True, grace_end.timestamp(), "node-b")
    assert (running.terminating, running.deleted_at) == (False, None)


def test_cordon_is_a_strategic_merge_patch_and_a_delete_takes_the_pods_grace_or_the_one_given():
    core = FakeCoreApi([[gpu_node("node-b")]], [[ray_pod("w-1", "worker"), ray_pod("w-2", "worker")]])
    cluster = KubernetesCluster(core, None)
    assert cluster.cordon_node("node-b") and not cluster.cordon_node("node-z")  # 404: no such node
    assert core.patches[0] == ("node-b", {"spec": {"unschedulable": True}}, cluster_api.STRATEGIC_MERGE_PATCH)
    assert cluster.list_nodes("role=gpu-worker")[0].unschedulable
    assert cluster.delete_pod("ray-train", "w-1") and cluster.delete_pod(
        "ray-train", "w-2", grace_period_seconds=0
    )
    assert not cluster.delete_pod("ray-train", "w-2")  # 404: gone at once
    assert core.deletions == [("ray-train", "w-1", None), ("ray-train", "w-2", 0), ("ray-train", "w-2", None)]
    (left,) = cluster.list_pods("ray-train", "ray.io/node-type=worker")
    assert left.name == "w-1" and left.terminating  # within its grace, until its kubelet ends it


def test_a_refused_cordon_says_who_refused():
    def patch_node(name, body, **_):
        raise ApiException(status=403, reason="Forbidden")

    cluster = KubernetesCluster(types.SimpleNamespace(patch_node=patch_node), None)
    with pytest.raises(errors.ApiUnauthorized, match="answered 403 to cordoning node node-b"):
        cluster.cordon_node("node-b")


def test_the_writes_reach_an_api_server_as_it_takes_them(tmp_path):
    """Through the real client over HTTPS (`fake_kube_api`): the cordon goes as a strategic merge patch,
    which the server merges into the node, and a delete at grace 0 removes the pod at once, where one
    with the pod's own grace leaves it Terminating."""
    kube = fake_kube_api.FakeKubeApi(
        tmp_path,
        lambda pod, container, argv: fake_kube_api.ExecReply(),
        nodes=[fake_kube_api.node("node-b")],
        pods=[fake_kube_api.pod("w-1", "worker"), fake_kube_api.pod("w-2", "worker")],
    ).start()
    (tmp_path / "ca.pem").write_bytes(kube.ca_pem)
    configuration = kubernetes.client.Configuration()
    configuration.host, configuration.ssl_ca_cert = kube.endpoint, str(tmp_path / "ca.pem")
    signed = "https://sts.amazonaws.com/?Action=GetCallerIdentity&X-Amz-SignedHeaders=host%3Bx-k8s-aws-id"
    configuration.api_key["authorization"] = (
        "k8s-aws-v1." + base64.urlsafe_b64encode(signed.encode()).decode()
    )
    configuration.api_key_prefix["authorization"] = "Bearer"
    try:
        with kubernetes.client.ApiClient(configuration) as client:
            core = kubernetes.client.CoreV1Api(client)
            cluster = KubernetesCluster(core, None, kube.endpoint)
            assert cluster.cordon_node("node-b") and not cluster.cordon_node("node-z")
            assert kube.nodes[0]["spec"]["unschedulable"] is True
            assert kube.patches[0][1:] == (
                "application/strategic-merge-patch+json",
                {"spec": {"unschedulable": True}},
            )
            assert cluster.delete_pod("ray-train", "w-1", grace_period_seconds=0)
            assert cluster.delete_pod("ray-train", "w-2")
            assert not cluster.delete_pod("ray-train", "w-1")
            assert kube.deletes == [
                ("ray-train", "w-1", 0),
                ("ray-train", "w-2", None),
                ("ray-train", "w-1", None),
            ]
            (left,) = cluster.list_pods("ray-train", "ray.io/node-type=worker")
            assert left.name == "w-2" and left.deleted_at is not None  # Terminating for its 30 s grace
    finally:
        kube.stop()
