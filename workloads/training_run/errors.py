"""What can stop a training run, as exceptions whose message is the whole story for the user.

The provider shows `str(error)` of a `TrainingRunError` as the failure of `pulumi up` and keeps
the traceback in its log file (`workloads.training_run.engine_host`). The subclasses are the
failures the provider explains further (which endpoint, which identity) before showing them.
"""

from __future__ import annotations


class TrainingRunError(Exception):
    """The training run cannot go on; the message says what was found and what to check."""


class ApiUnreachable(TrainingRunError):
    """The Kubernetes API endpoint did not answer within the time limits, after the retries."""

    def __init__(self, endpoint: str, what: str, detail: str) -> None:
        super().__init__(f"the Kubernetes API at {endpoint} did not answer {what}: {detail}")
        self.endpoint, self.what, self.detail = endpoint, what, detail


class ApiUnauthorized(TrainingRunError):
    """The Kubernetes API refused the caller (HTTP 401 or 403)."""

    def __init__(self, status: int, what: str, detail: str) -> None:
        super().__init__(f"the Kubernetes API answered {status} to {what}: {detail}")
        self.status, self.what, self.detail = status, what, detail


class ExecStreamCut(TrainingRunError):
    """An exec stream ended without the exit status: its output may be cut short, so it is not used."""


class Interrupted(TrainingRunError):
    """`pulumi up` was interrupted (Ctrl-C): the provider stopped waiting."""
