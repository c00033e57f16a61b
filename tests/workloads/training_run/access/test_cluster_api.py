"""The cluster queries: a REST answer that may pass asked again until the attempts are spent, a\nread in each pod."""

from __future__ import annotations

import threading
import types

import pytest
from kubernetes.client.exceptions import ApiException

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
