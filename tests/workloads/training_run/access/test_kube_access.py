"""Kubernetes access: the exec channel (container, status, interrupts) and the retries of calls that may pass."""

from __future__ import annotations

import json
import threading
import types

import pytest
import websocket
from kubernetes.client.exceptions import ApiException

from tests.harness.training_run_fakes import HEAD_POD, FakeCoreApi, FakeCustomObjects, ray_pod
from workloads.training_run import errors
from workloads.training_run.access import kube_access
from workloads.training_run.access.kube_access import ExecResult, KubernetesCluster, _exec_status


class FakeExecStream:
    """The parts of `kubernetes.stream.ws_client.WSClient` that `PodExecutor` uses."""

    clock = 0.0  # what `time.monotonic` reads in kube_access while these streams are used

    def __init__(self, stdout: str, stderr: str, status: str, finishes: bool = True):
        self.stdout, self.stderr, self.status, self.finishes = stdout, stderr, status, finishes
        self.closed = False
        self.waits: list[float] = []
        self.close_timeout: float | None = None

    def update(self, timeout):
        """Wait for frames: a command that does not finish sends none, so the wait takes its timeout."""
        self.waits.append(timeout)
        FakeExecStream.clock += timeout

    def is_open(self):
        return not self.finishes

    def read_stdout(self, timeout=None):
        return self.stdout

    def read_stderr(self, timeout=None):
        return self.stderr

    def read_channel(self, channel, timeout=0):
        assert channel == 3  # the exec error channel: the command's exit status
        return self.status

    def close(self, **kwargs):
        self.closed = True
        self.close_timeout = kwargs.get("timeout")


@pytest.fixture
def exec_clock(monkeypatch):
    """kube_access's clock is the fake streams' clock: a stalled command's wait takes no real time."""
    monkeypatch.setattr(FakeExecStream, "clock", 0.0)
    monkeypatch.setattr(kube_access, "time", types.SimpleNamespace(monotonic=lambda: FakeExecStream.clock))


def test_pod_executor_runs_the_command_in_the_first_container(monkeypatch, exec_clock):
    calls = []
    replies = [
        FakeExecStream("42\n", "", '{"status":"Success"}'),
        FakeExecStream(
            "", "boom", '{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"2"}]}}'
        ),
        FakeExecStream("", "", "", finishes=False),
        FakeExecStream("log files: 8\n", "", ""),  # the stream ended without the Status frame
    ]

    def fake_stream(method, name, namespace, **kwargs):
        calls.append((method, name, namespace, kwargs))
        return replies[len(calls) - 1]

    monkeypatch.setattr(kube_access, "stream", fake_stream)
    core = FakeCoreApi([[]], [[ray_pod(HEAD_POD, "head")]])
    core.connect_get_namespaced_pod_exec = object()
    cluster = KubernetesCluster(core, FakeCustomObjects())
    executor = cluster.executor("ray-train", cluster.list_pods("ray-train", "ray.io/node-type=head")[0])
    assert executor.run(["cat", "/opt/eks-ray-train/.code-hash"], 30) == ExecResult(0, "42\n", "")
    method, name, namespace, kwargs = calls[0]
    assert (method, name, namespace) == (core.connect_get_namespaced_pod_exec, HEAD_POD, "ray-train")
    assert kwargs == {
        "container": "ray-head",
        "command": ["cat", "/opt/eks-ray-train/.code-hash"],
        "stdout": True,
        "stderr": True,
        "stdin": False,
        "tty": False,
        "_preload_content": False,
    }
    assert executor.run(["false"], 30) == ExecResult(2, "", "boom")
    with pytest.raises(
        kube_access.CommandTimeout, match=f"`sleep` in pod {HEAD_POD} did not finish within 5 s"
    ):
        executor.run(["sleep", "60"], 5)
    with pytest.raises(errors.ExecStreamCut, match="ended without an exit status after 13 characters"):
        executor.run(["sh", "-c", "grep NCCL"], 30)
    assert all(reply.closed for reply in replies)
    stalled = replies[2]
    assert sum(stalled.waits) == pytest.approx(5) and max(stalled.waits) == kube_access.CANCEL_CHECK_S
    assert stalled.close_timeout == kube_access.CANCEL_CHECK_S  # no 3 s wait for a close frame


def test_an_interrupt_ends_a_running_exec_within_one_check(monkeypatch, exec_clock):
    """`pulumi up` interrupted while a command runs in the pod: the wait ends at the next look."""
    cancelled = threading.Event()
    stream = FakeExecStream("", "", "", finishes=False)
    original_update = stream.update

    def update(timeout):
        original_update(timeout)
        if len(stream.waits) == 3:
            cancelled.set()

    stream.update = update
    monkeypatch.setattr(kube_access, "stream", lambda *args, **kwargs: stream)
    core = types.SimpleNamespace(connect_get_namespaced_pod_exec=object())
    executor = kube_access.PodExecutor(core, "ray-train", HEAD_POD, "ray-head", cancelled=cancelled)
    with pytest.raises(errors.Interrupted, match=f"interrupted while `python` ran in pod {HEAD_POD}"):
        executor.run(["python", "-c", "..."], 120)
    assert len(stream.waits) == 3 and stream.closed


def test_exec_status_comes_from_the_error_channel():
    assert _exec_status('{"metadata":{},"status":"Success"}') == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert _exec_status(json.dumps(failure)) == 3
    assert _exec_status(json.dumps({"status": "Failure", "message": "executable file not found"})) == 126
    assert _exec_status("not a status") == 126


def test_retry_delay_honours_retry_after_within_its_cap_else_backs_off():
    assert kube_access.retry_delay(1, "2") == 2.0
    assert kube_access.retry_delay(1, "3600") == kube_access.RETRY_AFTER_MAX_S
    assert kube_access.retry_delay(1, None) == kube_access.BACKOFF_S
    assert kube_access.retry_delay(2, "Wed, 21 Oct 2015 07:28:00 GMT") == 2 * kube_access.BACKOFF_S
    assert kube_access.retry_delay(10, None) == kube_access.BACKOFF_MAX_S


def _handshake_failure(status: int, message: str, body: bytes, headers: dict) -> ApiException:
    """What kubernetes-client 37 raises for a refused exec (stream/ws_client.py, websocket_call)."""
    try:
        try:
            raise websocket.WebSocketBadStatusException(
                f"Handshake status {status} {message} -+-+- {headers} -+-+- {body!r}",
                status,
                message,
                headers,
                body,
            )
        except Exception as cause:
            raise ApiException(status=0, reason=str(cause))  # noqa: B904 (the client's own wording)
    except ApiException as error:
        return error


def test_a_refused_handshake_gives_its_status_retry_after_and_the_apis_message():
    body = json.dumps({"kind": "Status", "message": "error dialing backend: dial tcp: i/o timeout"}).encode()
    error = _handshake_failure(500, "Internal Server Error", body, {"retry-after": "3"})
    assert kube_access.handshake_refusal(error) == (
        500,
        "3",
        "Internal Server Error error dialing backend: dial tcp: i/o timeout",
    )
    assert (
        kube_access.handshake_refusal(ApiException(status=0, reason="Handshake status 404 Not Found"))[0]
        == 404
    )
    assert (
        kube_access.handshake_refusal(ApiException(status=0, reason="[Errno 111] Connection refused")) is None
    )


def test_a_rest_answer_that_may_pass_is_asked_again_until_the_attempts_are_spent():
    calls = []

    def list_node(label_selector, **_):
        calls.append(label_selector)
        raise ApiException(status=429, reason="Too Many Requests")

    core = types.SimpleNamespace(list_node=list_node)
    cluster = KubernetesCluster(core, None, timeouts=kube_access.ApiTimeouts(attempts=3, backoff_s=0.001))
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
    pods = [kube_access.PodFacts(name, "Running", True, "ray-worker") for name in ("worker-a", "worker-b")]
    listings = kube_access.stdout_of_each_pod(
        pods, lambda pod: _Answers(ExecResult(0, f"from {pod.name}\n")), ["cat", "x"], "x"
    )
    assert listings == {"worker-a": "from worker-a\n", "worker-b": "from worker-b\n"}
    failing = {"worker-a": ExecResult(0, "ok\n"), "worker-b": ExecResult(2, "", "cat: x: No such file")}
    with pytest.raises(errors.TrainingRunError) as raised:
        kube_access.stdout_of_each_pod(
            pods, lambda pod: _Answers(failing[pod.name]), ["cat", "x"], "the file x"
        )
    assert str(raised.value) == (
        "reading the file x of worker pod worker-b failed (exit 2): cat: x: No such file"
    )
