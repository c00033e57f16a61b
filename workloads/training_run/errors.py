"""What can stop a training run, as exceptions whose message is the whole story for the user.

The provider shows `str(error)` of a `TrainingRunError` as the failure of `pulumi up` and keeps
the traceback in its log file (`workloads.training_run.engine_host`). The subclasses are the
failures the provider explains further (which endpoint, which identity) before showing them.
"""

from __future__ import annotations

import botocore.exceptions

# What a failure after submission leaves behind, said wherever the run stops without the job ending.
JOB_KEEPS_RUNNING = (
    "A job already submitted keeps running on the Ray cluster; the next `pulumi up` follows it to its end"
)


def aws_refusal(error: botocore.exceptions.ClientError) -> str:
    """`Code: Message` of an AWS API refusal, on one line."""
    detail = error.response.get("Error", {})
    return f"{detail.get('Code', '')}: {' '.join(str(detail.get('Message', '')).split())}"


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


class EndpointNameUnresolved(ApiUnreachable):
    """The API endpoint's host name did not resolve (DNS), so no packet was sent to it."""


class ApiRefused(TrainingRunError):
    """The Kubernetes API kept answering an error status (429, 5xx, ...) after the bounded retries."""

    def __init__(self, status: int, what: str, detail: str) -> None:
        super().__init__(f"the Kubernetes API answered {status} to {what}: {detail}")
        self.status, self.what, self.detail = status, what, detail


class PodGone(TrainingRunError):
    """An exec found no such pod (HTTP 404): the pod was deleted or replaced."""

    def __init__(self, pod: str, what: str, detail: str) -> None:
        super().__init__(f"pod {pod} no longer exists ({what} answered 404: {detail})")
        self.pod, self.what, self.detail = pod, what, detail


class RayClusterNotFound(TrainingRunError):
    """The RayCluster custom resource does not exist."""
