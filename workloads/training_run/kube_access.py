"""The two small I/O interfaces the training run needs, and their real implementations.

The training run decides everything from plain facts (`NodeFacts`, `PodFacts`) and
command results (`ExecResult`). Only the classes here touch the outside world:

- `ClusterApi`: list GPU nodes, list pods, read a pod's events, count a RayCluster's workers.
  `KubernetesCluster` implements it over the Kubernetes Python client; tests hand it a fake
  `CoreV1Api`, so the conversion from Kubernetes objects is exercised without a cluster.
- `Executor`: run one command and return its exit status and output. `PodExecutor` runs it
  inside a pod through the API server's exec stream (the Ray dashboard stays internal: no port
  is forwarded or exposed); `LocalExecutor` runs it here, which is how the end-to-end test drives
  a real local Ray head through exactly the same commands.

Every call is bounded (`ApiTimeouts`): a connect and a read timeout per attempt, and a few
attempts, so an endpoint that never answers (the caller's address outside
`endpointPublicAccessCidrs` drops the packets) fails in minutes with `ApiUnreachable`. A 401/403
becomes `ApiUnauthorized`. An exec stream that ends without the Status frame on the error
channel raises `ExecStreamCut`: its output may be cut short, so it never counts as a result.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import urllib3
import websocket
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL

from workloads.training_run.errors import ApiUnauthorized, ApiUnreachable, ExecStreamCut, Interrupted

T = TypeVar("T")


COMMAND_TIMEOUT_S = 120  # a short command in a pod (a `cat`, a log grep, a Jobs API call)
CANCEL_CHECK_S = 0.1  # how often a running exec looks whether `pulumi up` was interrupted


class CommandTimeout(Exception):
    """A command did not finish within its time limit."""


@dataclass(frozen=True)
class ApiTimeouts:
    """Bounds of every Kubernetes API call: seconds to connect, to wait for an answer, and attempts."""

    connect_s: float = 10.0
    read_s: float = 30.0
    attempts: int = 3

    @property
    def request_timeout(self) -> tuple[float, float]:
        """The client's `_request_timeout`: (connect, read)."""
        return (self.connect_s, self.read_s)

    def describe(self) -> str:
        return (
            f"{self.attempts} attempts, each {self.connect_s:g} s to connect and {self.read_s:g} s to answer"
        )


DEFAULT_TIMEOUTS = ApiTimeouts()


@dataclass(frozen=True)
class ExecResult:
    """Exit status and output of one command; stdout and stderr are kept apart for JSON parsing."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def output(self) -> str:
        """Both streams, for error messages."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)


class Executor(Protocol):
    """Runs a command somewhere (a pod, this machine) and waits for it."""

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult: ...


@dataclass(frozen=True)
class NodeFacts:
    """What the checks need to know about one node."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    ready: bool


@dataclass(frozen=True)
class PodFacts:
    """What the readiness wait and the exec need to know about one pod.

    `container` is the pod's first container: KubeRay requires the Ray container to be first.
    `problems` are waiting/terminated reasons of its containers (`ImagePullBackOff: ...`).
    """

    name: str
    phase: str
    ready: bool
    container: str
    node_name: str | None = None
    terminating: bool = False
    problems: tuple[str, ...] = field(default_factory=tuple)
    annotations: Mapping[str, str] = field(default_factory=dict)


class ClusterApi(Protocol):
    """The read-only cluster queries of the training run."""

    def list_nodes(self, label_selector: str) -> list[NodeFacts]: ...

    def list_pods(self, namespace: str, label_selector: str) -> list[PodFacts]: ...

    def pod_events(self, namespace: str, pod_name: str) -> list[str]: ...

    def ray_cluster_worker_count(self, namespace: str, name: str) -> int: ...


class RayClusterNotFound(Exception):
    """The RayCluster custom resource does not exist."""


class KubernetesCluster:
    """`ClusterApi` over the Kubernetes Python client (`CoreV1Api`, `CustomObjectsApi`)."""

    EVENTS_PER_POD = 5

    def __init__(
        self,
        core_api,
        custom_objects_api,
        endpoint: str = "",
        timeouts: ApiTimeouts = DEFAULT_TIMEOUTS,
        cancelled: threading.Event | None = None,
    ) -> None:
        self._core = core_api
        self._custom = custom_objects_api
        self.endpoint = endpoint
        self.timeouts = timeouts
        self.cancelled = cancelled or threading.Event()

    def _call(self, what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One REST call, bounded by `timeouts` (the client's urllib3 retries do the attempts)."""
        try:
            return method(*args, _request_timeout=self.timeouts.request_timeout, **kwargs)
        except ApiException as error:
            if error.status in (401, 403):
                raise ApiUnauthorized(error.status, what, _short(error.reason, error.body)) from error
            raise
        except urllib3.exceptions.HTTPError as error:
            raise ApiUnreachable(
                self.endpoint, what, f"{self.timeouts.describe()}; last error: {_short(str(error))}"
            ) from error

    def list_nodes(self, label_selector: str) -> list[NodeFacts]:
        nodes = self._call("listing nodes", self._core.list_node, label_selector=label_selector).items
        return [_node_facts(node) for node in nodes]

    def list_pods(self, namespace: str, label_selector: str) -> list[PodFacts]:
        pods = self._call(
            "listing pods", self._core.list_namespaced_pod, namespace, label_selector=label_selector
        ).items
        return [_pod_facts(pod) for pod in pods]

    def pod_events(self, namespace: str, pod_name: str) -> list[str]:
        """The pod's latest events, warnings first: they say why a pod is stuck."""
        events = self._call(
            "listing events",
            self._core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
        ).items
        events = sorted(events, key=_event_time)[-self.EVENTS_PER_POD :]
        events.sort(key=lambda event: event.type != "Warning")
        return [
            f"{event.type} {event.reason}: {(event.message or '').strip()}"
            + (f" (x{event.count})" if event.count and event.count > 1 else "")
            for event in events
        ]

    def ray_cluster_worker_count(self, namespace: str, name: str) -> int:
        """Worker pods the RayCluster asks for: replicas (times hosts) summed over its groups."""
        try:
            body = self._call(
                "reading the RayCluster",
                self._custom.get_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayclusters",
                name,
            )
        except ApiException as error:
            if error.status == 404:
                raise RayClusterNotFound(f"RayCluster {namespace}/{name} does not exist") from None
            raise
        groups = body.get("spec", {}).get("workerGroupSpecs", [])
        return sum(int(group.get("replicas", 0)) * int(group.get("numOfHosts", 1)) for group in groups)

    def executor(self, namespace: str, pod: PodFacts) -> PodExecutor:
        return PodExecutor(
            self._core, namespace, pod.name, pod.container, self.endpoint, self.timeouts, self.cancelled
        )


def _short(*parts: object, limit: int = 300) -> str:
    text = " ".join(str(part).strip() for part in parts if part)
    return text if len(text) <= limit else text[:limit] + "..."


def _event_time(event) -> str:
    moment = event.last_timestamp or event.event_time or event.first_timestamp
    return moment.isoformat() if moment is not None else ""


def _node_facts(node) -> NodeFacts:
    conditions = (node.status.conditions or []) if node.status else []
    return NodeFacts(
        name=node.metadata.name,
        labels=dict(node.metadata.labels or {}),
        allocatable=dict((node.status.allocatable or {}) if node.status else {}),
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
    )


def _pod_facts(pod) -> PodFacts:
    status = pod.status
    conditions = (status.conditions or []) if status else []
    problems = []
    for container in (status.container_statuses or []) if status else []:
        state = container.state
        for stuck in (state.waiting, state.terminated) if state else ():
            if stuck is not None and stuck.reason not in (
                None,
                "ContainerCreating",
                "PodInitializing",
                "Completed",
            ):
                problems.append(
                    f"{container.name} {stuck.reason}" + (f": {stuck.message}" if stuck.message else "")
                )
    if status and status.reason:
        problems.append(f"pod {status.reason}" + (f": {status.message}" if status.message else ""))
    return PodFacts(
        name=pod.metadata.name,
        phase=(status.phase if status else None) or "Unknown",
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        container=pod.spec.containers[0].name,
        node_name=pod.spec.node_name,
        terminating=pod.metadata.deletion_timestamp is not None,
        problems=tuple(problems),
        annotations=dict(pod.metadata.annotations or {}),
    )


class PodExecutor:
    """Runs a command in a pod's container through the API server's exec websocket.

    The exit status comes from the Status object on the exec error channel (`Success`, or
    `NonZeroExitCode` with the status as its cause); a command that cannot start reports 126
    with the API's message. A stream that closes without that Status raises `ExecStreamCut`.
    Opening the stream is retried (the command has not started yet); a cut stream is not.
    The wait for the command ends within `CANCEL_CHECK_S` once `cancelled` is set (`pulumi up`
    interrupted), raising `Interrupted`: a long command never holds the provider host's exit.
    """

    _HANDSHAKE_STATUS = re.compile(r"Handshake status (\d{3})")

    def __init__(
        self,
        core_api,
        namespace: str,
        pod: str,
        container: str,
        endpoint: str = "",
        timeouts: ApiTimeouts = DEFAULT_TIMEOUTS,
        cancelled: threading.Event | None = None,
    ) -> None:
        self._core = core_api
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.endpoint = endpoint
        self.timeouts = timeouts
        self.cancelled = cancelled or threading.Event()

    def _open(self, argv: Sequence[str]):
        # The kubernetes client opens its websocket without a timeout; websocket-client's default
        # timeout bounds the connect, the TLS and HTTP handshake and each frame read.
        websocket.setdefaulttimeout(self.timeouts.connect_s + self.timeouts.read_s)
        last = ""
        for _ in range(self.timeouts.attempts):
            try:
                return stream(
                    self._core.connect_get_namespaced_pod_exec,
                    self.pod,
                    self.namespace,
                    container=self.container,
                    command=list(argv),
                    stdout=True,
                    stderr=True,
                    stdin=False,
                    tty=False,
                    _preload_content=False,
                )
            except ApiException as error:
                reason = str(error.reason or error)
                status = self._HANDSHAKE_STATUS.search(reason)
                if status and status.group(1) in ("401", "403"):
                    raise ApiUnauthorized(
                        int(status.group(1)), f"exec in pod {self.pod}", _short(reason)
                    ) from error
                if status:
                    raise
                last = reason
        raise ApiUnreachable(
            self.endpoint,
            f"exec of `{argv[0]}` in pod {self.pod}",
            f"{self.timeouts.describe()}; last error: {_short(last)}",
        )

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        response = self._open(argv)
        lost, stdout, stderr, status = "", "", "", ""
        try:
            self._wait(response, argv, timeout_s)
            stdout = response.read_stdout(timeout=0) or ""
            stderr = response.read_stderr(timeout=0) or ""
            status = response.read_channel(ERROR_CHANNEL)
        except (websocket.WebSocketException, OSError) as error:  # the connection dropped mid-stream
            lost = f": {error}"
        finally:
            # The close handshake waits for the peer's close frame (websocket-client: 3 s by
            # default); a stream closed by an interrupt or a timeout need not wait for a command
            # that is still running.
            with contextlib.suppress(websocket.WebSocketException, OSError):
                response.close(timeout=CANCEL_CHECK_S)
        if lost or not status:
            raise ExecStreamCut(
                f"the exec stream of `{argv[0]}` in pod {self.pod} ended without an exit status after "
                f"{len(stdout)} characters of output (connection cut{lost}): the output may be incomplete "
                "and was not used"
            )
        return ExecResult(_exec_status(status), stdout, stderr)

    def _wait(self, response, argv: Sequence[str], timeout_s: float) -> None:
        """The client's `run_forever(timeout)`, in slices that look at `cancelled` between them."""
        deadline = time.monotonic() + timeout_s
        while response.is_open():
            if self.cancelled.is_set():
                raise Interrupted(f"pulumi up was interrupted while `{argv[0]}` ran in pod {self.pod}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"`{argv[0]}` in pod {self.pod} did not finish within {timeout_s:.0f} s")
            response.update(timeout=min(remaining, CANCEL_CHECK_S))


def _exec_status(error_channel: str) -> int:
    """Exit status from the exec error channel's Status object (`metav1.Status`)."""
    status = yaml.safe_load(error_channel)
    if not isinstance(status, dict):
        return 126
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", 1))
    return 126


class LocalExecutor:
    """Runs a command on this machine: the local stand-in for a pod in tests and demos."""

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        self.env = dict(env) if env is not None else None
        self.cwd = cwd

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout_s, env=self.env, cwd=self.cwd
            )
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"`{argv[0]}` did not finish within {timeout_s:.0f} s") from None
        except FileNotFoundError as error:
            return ExecResult(127, "", str(error))
        return ExecResult(done.returncode, done.stdout, done.stderr)
