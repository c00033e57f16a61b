"""`workloads/training_run/errors.py`: each failure's message is the whole story in one line, and the
failures the provider explains further keep what it explains them by."""

from __future__ import annotations

import botocore.exceptions
import pytest

from workloads.training_run import errors


def test_an_aws_refusal_is_code_and_message_on_one_line():
    error = botocore.exceptions.ClientError(
        {
            "Error": {
                "Code": "AccessDeniedException",
                "Message": "User: arn:aws:iam::1:user/x\n  is not authorized",
            }
        },
        "DescribeNodegroup",
    )
    assert errors.aws_refusal(error) == "AccessDeniedException: User: arn:aws:iam::1:user/x is not authorized"


def test_api_failures_say_what_was_asked_and_keep_their_parts():
    unreachable = errors.ApiUnreachable("https://10.0.0.1", "listing nodes", "timed out")
    assert (
        str(unreachable) == "the Kubernetes API at https://10.0.0.1 did not answer listing nodes: timed out"
    )
    assert (unreachable.endpoint, unreachable.what, unreachable.detail) == (
        "https://10.0.0.1",
        "listing nodes",
        "timed out",
    )
    refused = errors.ApiRefused(429, "listing pods", "Too many requests")
    assert str(refused) == "the Kubernetes API answered 429 to listing pods: Too many requests"
    unauthorized = errors.ApiUnauthorized(401, "listing pods", "Unauthorized")
    assert unauthorized.status == 401
    gone = errors.PodGone("ray-worker-1", "exec", 'pods "ray-worker-1" not found')
    assert str(gone) == 'pod ray-worker-1 no longer exists (exec answered 404: pods "ray-worker-1" not found)'


def test_every_failure_is_a_training_run_error():
    """The provider shows `str(error)` of a `TrainingRunError` as the failure of `pulumi up`."""
    failures = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__
    ]
    assert failures and all(issubclass(failure, errors.TrainingRunError) for failure in failures)
    assert issubclass(errors.EndpointNameUnresolved, errors.ApiUnreachable)


@pytest.mark.parametrize(
    ("sts_error", "accepted_before", "cause"),
    [
        ("ExpiredToken", True, "expired"),
        ("ExpiredToken", False, "expired"),
        ("InvalidClientTokenId", False, "invalid"),
        (None, True, "revoked"),
        (None, False, "no-access-entry"),
        ("Throttling", False, "no-access-entry"),
    ],
)
def test_a_401_is_explained_by_what_sts_says_of_the_credentials(sts_error, accepted_before, cause):
    assert errors.unauthorized_cause(sts_error, accepted_before) == cause
