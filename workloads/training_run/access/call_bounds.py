"""How long a Kubernetes API call may take, and which answers are asked again.

Every call is bounded (`ApiTimeouts`): a connect and a read timeout per attempt, and a few
attempts, so an endpoint that never answers (the caller's address outside
`endpointPublicAccessCidrs` drops the packets) fails in minutes. An answer that may pass
(`RETRY_STATUSES`: API priority and fairness shedding load with 429 and `Retry-After`, a 5xx such
as EKS's "error dialing backend" while the API server cannot reach a kubelet) is asked again after
`retry_delay`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass

import urllib3

from workloads.training_run.errors import (
    Interrupted,
)

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


def retry_delay(attempt: int, retry_after: str | None, backoff_s: float = BACKOFF_S) -> float:
    """Seconds to wait after failed attempt `attempt` (1, 2, ...): the server's `Retry-After`
    (seconds; an HTTP date or nonsense falls back to the backoff), capped, else the backoff."""
    with contextlib.suppress(TypeError, ValueError):
        return min(max(float(retry_after), 0.0), RETRY_AFTER_MAX_S)  # type: ignore[arg-type]
    return min(backoff_s * 2 ** (attempt - 1), BACKOFF_MAX_S)


def pause(cancelled: threading.Event, seconds: float, what: str) -> None:
    """Wait before a retry; an interrupted `pulumi up` does not wait for it."""
    if cancelled.wait(seconds):
        raise Interrupted(f"pulumi up was interrupted while retrying {what}")


def name_unresolved(error: BaseException | None) -> bool:
    """Whether a connection error, or one it wraps, is a failed DNS lookup."""
    while error is not None:
        if isinstance(error, (urllib3.exceptions.NameResolutionError, socket.gaierror)):
            return True
        reason = getattr(error, "reason", None)
        error = reason if isinstance(reason, BaseException) else error.__context__
    return False


def short(*parts: object, limit: int = 300) -> str:
    text = " ".join(str(part).strip() for part in parts if part)
    return text if len(text) <= limit else text[:limit] + "..."
