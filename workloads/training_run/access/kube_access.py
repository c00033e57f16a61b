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
`endpointPublicAccessCidrs` drops the packets) fails in minutes with `ApiUnreachable`
(`EndpointNameUnresolved` when its name does not resolve). A 401/403 becomes `ApiUnauthorized`.
An answer that may pass (`RETRY_STATUSES`: API priority and fairness shedding load with 429 and
`Retry-After`, a 5xx such as EKS's "error dialing backend" while the API server cannot reach a
kubelet) is asked again after `retry_delay`; when the attempts are spent it becomes `ApiRefused`.
An exec whose pod is gone (404) raises `PodGone`. An exec stream that ends without the Status
frame on the error channel raises `ExecStreamCut`: its output may be cut short, so it never
counts as a result.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
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

from workloads.training_run.errors import (
    ApiRefused,
    ApiUnauthorized,
    ApiUnreachable,
    EndpointNameUnresolved,
    ExecStreamCut,
    Interrupted,
    PodGone,
    RayClusterNotFound,
    TrainingRunError,
)

T = TypeVar("T")


COMMAND_TIMEOUT_S = 120  # a short command in a pod (a `cat`, a log grep, a Jobs API call)
CANCEL_CHECK_S = 0.1  # how often a running exec looks whether `pulumi up` was interrupted
# Answers that say "not now" rather than "no": 429 from API priority and fairness, and 5xx from the
# API server or the kubelet proxy behind it. The exec handshake adds 400: the API server refuses
# an exec while the container is not running (a restart), which passes once it runs again.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
EXEC_RETRY_STATUSES = RETRY_STATUSES | {400}
# The wait before attempt n+1 is BACKOFF_S * 2**(n-1), at most BACKOFF_MAX_S; a `Retry-After`
# header is honoured up to RETRY_AFTER_MAX_S. With the default 3 attempts a call gives up within
# about a minute, so every fault reaches the user in well under 3 minutes.
BACKOFF_S = 1.0
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 30.0


class CommandTimeout(Exception):
    """A command did not finish within its time limit."""


@dataclass(frozen=True)
class ApiTimeouts:
    """Bounds of every Kubernetes API call: seconds to connect, to wait for an answer, and attempts."""

    connect_s: float = 10.0
    read_s: float = 30.0
    attempts: int = 3
    backoff_s: float = BACKOFF_S  # the first wait before asking again (`retry_delay`)

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
    # spec.providerID: on EKS `aws:///<zone>/<instance id>`, set by the cloud provider when the node
    # registers; "" where it is not set.
    provider_id: str = ""


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
    uid: str = ""  # metadata.uid: a pod replaced under the same name has a new one
    namespace: str = ""  # metadata.namespace: the Ray pods' or the EFA counter readers'


def stdout_of_each_pod(
    pods: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor], argv: list[str], what: str
) -> dict[str, str]:
    """`argv` run in each pod: pod name -> its stdout. A failure names `what` was being read, the
    pod, the exit status and the output."""
    found = {}
    for pod in pods:
        result = executor_for(pod).run(argv, COMMAND_TIMEOUT_S)
        if result.returncode != 0:
            raise TrainingRunError(
                f"reading {what} of worker pod {pod.name} failed (exit {result.returncode}): {result.output}"
            )
        found[pod.name] = result.stdout
    return found


class ClusterApi(Protocol):
    """The read-only cluster queries of the training run."""

    def list_nodes(self, label_selector: str) -> list[NodeFacts]: ...

    def list_pods(self, namespace: str, label_selector: str) -> list[PodFacts]: ...

    def pod_events(self, namespace: str, pod_name: str) -> list[str]: ...

    def ray_cluster_worker_count(self, namespace: str, name: str) -> int: ...


def retry_delay(attempt: int, retry_after: str | None, backoff_s: float = BACKOFF_S) -> float:
    """Seconds to wait after failed attempt `attempt` (1, 2, ...): the server's `Retry-After`
    (seconds; an HTTP date or nonsense falls back to the backoff), capped, else the backoff."""
    with contextlib.suppress(TypeError, ValueError):
        return min(max(float(retry_after), 0.0), RETRY_AFTER_MAX_S)  # type: ignore[arg-type]
    return min(backoff_s * 2 ** (attempt - 1), BACKOFF_MAX_S)


def _pause(cancelled: threading.Event, seconds: float, what: str) -> None:
    """Wait before a retry; an interrupted `pulumi up` does not wait for it."""
    if cancelled.wait(seconds):
        raise Interrupted(f"pulumi up was interrupted while retrying {what}")


def _name_unresolved(error: BaseException | None) -> bool:
    """Whether a connection error, or one it wraps, is a failed DNS lookup."""
    while error is not None:
        if isinstance(error, (urllib3.exceptions.NameResolutionError, socket.gaierror)):
            return True
        reason = getattr(error, "reason", None)
        error = reason if isinstance(reason, BaseException) else error.__context__
    return False


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
        self.accepted = False  # the API answered a call: it knows the caller's identity

    def _call(self, what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One REST call, bounded by `timeouts`: the client's urllib3 retries a connection that
        fails, this loop an answer in `RETRY_STATUSES` (every call here is a GET)."""
        for attempt in range(1, self.timeouts.attempts + 1):
            try:
                answer = method(*args, _request_timeout=self.timeouts.request_timeout, **kwargs)
                self.accepted = True
                return answer
            except ApiException as error:
                if error.status in (401, 403):
                    raise ApiUnauthorized(error.status, what, _short(error.reason, error.body)) from error
                if error.status not in RETRY_STATUSES:
                    raise
                if attempt == self.timeouts.attempts:
                    raise ApiRefused(
                        error.status,
                        what,
                        f"{_short(error.reason, error.body)} ({self.timeouts.attempts} attempts)",
                    ) from error
                _pause(
                    self.cancelled,
                    retry_delay(attempt, (error.headers or {}).get("Retry-After"), self.timeouts.backoff_s),
                    what,
                )
            except urllib3.exceptions.HTTPError as error:
                unreachable = EndpointNameUnresolved if _name_unresolved(error) else ApiUnreachable
                raise unreachable(
                    self.endpoint, what, f"{self.timeouts.describe()}; last error: {_short(str(error))}"
                ) from error
        raise AssertionError("unreachable")

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
                raise RayClusterNotFound(
                    f"RayCluster {namespace}/{name} does not exist: the program creates it before the "
                    "TrainingRun, so it was deleted outside Pulumi; run `pulumi refresh`, then `pulumi up` "
                    "creates it again"
                ) from None
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
        provider_id=(node.spec.provider_id or "") if node.spec else "",
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
        uid=pod.metadata.uid or "",
        namespace=pod.metadata.namespace or "",
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
        """The exec stream. A failed handshake never started the command (the API server answers
        101 before the kubelet starts it), so asking again cannot run it twice."""
        # The kubernetes client opens its websocket without a timeout; websocket-client's default
        # timeout bounds the connect, the TLS and HTTP handshake and each frame read.
        websocket.setdefaulttimeout(self.timeouts.connect_s + self.timeouts.read_s)
        what = f"exec of `{argv[0]}` in pod {self.pod}"
        last = ""
        for attempt in range(1, self.timeouts.attempts + 1):
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
                refusal = handshake_refusal(error)
                if refusal is None:  # no answer at all: the connection failed
                    last = str(error.reason or error)
                    if _name_unresolved(error.__context__):
                        raise EndpointNameUnresolved(
                            self.endpoint, what, f"{self.timeouts.describe()}; last error: {_short(last)}"
                        ) from error
                    continue
                status, retry_after, detail = refusal
                if status in (401, 403):
                    raise ApiUnauthorized(status, f"exec in pod {self.pod}", detail) from error
                if status == 404:
                    raise PodGone(self.pod, what, detail) from error
                if status not in EXEC_RETRY_STATUSES or attempt == self.timeouts.attempts:
                    raise ApiRefused(status, what, f"{detail} ({attempt} attempts)") from error
                _pause(self.cancelled, retry_delay(attempt, retry_after, self.timeouts.backoff_s), what)
        raise ApiUnreachable(self.endpoint, what, f"{self.timeouts.describe()}; last error: {_short(last)}")

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
        code = _exec_status(status)
        if code == 126 and not stderr:  # the command never started: the Status says why
            stderr = _status_message(status)
        return ExecResult(code, stdout, stderr)

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


_HANDSHAKE_STATUS = re.compile(r"Handshake status (\d{3})")


def handshake_refusal(error: ApiException) -> tuple[int, str | None, str] | None:
    """(HTTP status, Retry-After, the API's message) of an exec the API server answered without
    upgrading; None when no answer came. kubernetes-client wraps every failure of the websocket
    handshake as `ApiException(status=0, reason=str(cause))` (stream/ws_client.py,
    `websocket_call`), raised while handling websocket-client's `WebSocketBadStatusException`,
    which keeps the status, the headers (lower-cased) and the body."""
    cause = error.__context__
    if isinstance(cause, websocket.WebSocketBadStatusException):
        body = cause.resp_body.decode("utf-8", "replace") if cause.resp_body else ""
        with contextlib.suppress(ValueError, AttributeError):
            body = json.loads(body).get("message") or body  # a metav1.Status
        headers = cause.resp_headers or {}
        return cause.status_code, headers.get("retry-after"), _short(cause.status_message, body)
    status = _HANDSHAKE_STATUS.search(str(error.reason or ""))
    return (int(status.group(1)), None, _short(str(error.reason))) if status else None


def _status_message(error_channel: str) -> str:
    """The message of a failure Status: a command the runtime could not start is reported as an
    `InternalError` Status with nothing on stderr (kubelet's exec streaming answers a failed start
    with `apierrors.NewInternalError`)."""
    with contextlib.suppress(yaml.YAMLError, AttributeError):
        return str(yaml.safe_load(error_channel).get("message") or "")
    return ""


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
