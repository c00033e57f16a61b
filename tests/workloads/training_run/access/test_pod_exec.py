"""The exec channel: the command in the first container, its status from the error channel, a\nrefused handshake, an interrupt that ends a running exec."""

from __future__ import annotations

import json
import threading
import types

import pytest
import websocket
from kubernetes.client.exceptions import ApiException

from tests.harness.training_run_fakes import HEAD_POD, FakeCoreApi, FakeCustomObjects, ray_pod
from workloads.training_run import errors
from workloads.training_run.access import commands, pod_exec
from workloads.training_run.access.cluster_api import KubernetesCluster
from workloads.training_run.access.commands import ExecResult
from workloads.training_run.access.pod_exec import _exec_status


class FakeExecStream:
    """The parts of `kubernetes.stream.ws_client.WSClient` that `PodExecutor` uses."""

    clock = 0.0  # what `time.monotonic` reads in pod_exec while these streams are used

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
    """pod_exec's clock is the fake streams' clock: a stalled command's wait takes no real time."""
    monkeypatch.setattr(FakeExecStream, "clock", 0.0)
    monkeypatch.setattr(pod_exec, "time", types.SimpleNamespace(monotonic=lambda: FakeExecStream.clock))


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

    monkeypatch.setattr(pod_exec, "stream", fake_stream)
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
    with pytest.raises(commands.CommandTimeout, match=f"`sleep` in pod {HEAD_POD} did not finish within 5 s"):
        executor.run(["sleep", "60"], 5)
    with pytest.raises(errors.ExecStreamCut, match="ended without an exit status after 13 characters"):
        executor.run(["sh", "-c", "grep NCCL"], 30)
    assert all(reply.closed for reply in replies)
    stalled = replies[2]
    assert sum(stalled.waits) == pytest.approx(5) and max(stalled.waits) == pod_exec.CANCEL_CHECK_S
    assert stalled.close_timeout == pod_exec.CANCEL_CHECK_S  # no 3 s wait for a close frame


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
    monkeypatch.setattr(pod_exec, "stream", lambda *args, **kwargs: stream)
    core = types.SimpleNamespace(connect_get_namespaced_pod_exec=object())
    executor = pod_exec.PodExecutor(core, "ray-train", HEAD_POD, "ray-head", cancelled=cancelled)
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
    assert pod_exec.handshake_refusal(error) == (
        500,
        "3",
        "Internal Server Error error dialing backend: dial tcp: i/o timeout",
    )
    assert (
        pod_exec.handshake_refusal(ApiException(status=0, reason="Handshake status 404 Not Found"))[0] == 404
    )
    assert pod_exec.handshake_refusal(ApiException(status=0, reason="[Errno 111] Connection refused")) is None
