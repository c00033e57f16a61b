"""A command in a pod's container, through the API server's exec stream.

The Ray dashboard stays internal: no port is forwarded or exposed. An exec whose pod is gone
(404) raises `PodGone`. An exec stream that ends without the Status frame on the error channel
raises `ExecStreamCut`: its output may be cut short, so it never counts as a result.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Sequence

import websocket
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL

from workloads.training_run.access.call_bounds import (
    DEFAULT_TIMEOUTS,
    EXEC_RETRY_STATUSES,
    ApiTimeouts,
    name_unresolved,
    pause,
    retry_delay,
    short,
)
from workloads.training_run.access.commands import CommandTimeout, ExecResult
from workloads.training_run.errors import (
    ApiRefused,
    ApiUnauthorized,
    ApiUnreachable,
    EndpointNameUnresolved,
    ExecStreamCut,
    Interrupted,
    PodGone,
)

CANCEL_CHECK_S = 0.1  # how often a running exec looks whether `pulumi up` was interrupted


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
                    if name_unresolved(error.__context__):
                        raise EndpointNameUnresolved(
                            self.endpoint, what, f"{self.timeouts.describe()}; last error: {short(last)}"
                        ) from error
                    continue
                status, retry_after, detail = refusal
                if status in (401, 403):
                    raise ApiUnauthorized(status, f"exec in pod {self.pod}", detail) from error
                if status == 404:
                    raise PodGone(self.pod, what, detail) from error
                if status not in EXEC_RETRY_STATUSES or attempt == self.timeouts.attempts:
                    raise ApiRefused(status, what, f"{detail} ({attempt} attempts)") from error
                pause(self.cancelled, retry_delay(attempt, retry_after, self.timeouts.backoff_s), what)
        raise ApiUnreachable(self.endpoint, what, f"{self.timeouts.describe()}; last error: {short(last)}")

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
        return cause.status_code, headers.get("retry-after"), short(cause.status_message, body)
    status = _HANDSHAKE_STATUS.search(str(error.reason or ""))
    return (int(status.group(1)), None, short(str(error.reason))) if status else None


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
