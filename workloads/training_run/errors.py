"""What can stop a training run, as exceptions whose message is the whole story for the user.

The provider shows `str(error)` of a `TrainingRunError` as the failure of `pulumi up` and keeps
the traceback in its log file (`workloads.training_run.engine_host`). The subclasses are the
failures the provider explains further (which endpoint, which identity) before showing them, with
the explanations at the end of this module (`explain_*`).
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


# --- a failed connection to the cluster, explained --------------------------------------------------

# STS error codes of credentials that are no longer good (AWS STS API reference, common errors).
EXPIRED_CREDENTIALS = frozenset({"ExpiredToken", "ExpiredTokenException", "RequestExpired"})
INVALID_CREDENTIALS = frozenset({"InvalidClientTokenId", "UnrecognizedClientException"})


def unauthorized_cause(sts_error: str | None, accepted_before: bool) -> str:
    """Why EKS refused the token: "expired" or "invalid" credentials (STS refuses them too),
    "revoked" (STS accepts them, the cluster accepted them earlier in this run: the access entry
    went away), else "no-access-entry"."""
    if sts_error in EXPIRED_CREDENTIALS:
        return "expired"
    if sts_error in INVALID_CREDENTIALS:
        return "invalid"
    return "revoked" if accepted_before else "no-access-entry"


def explain_unauthorized(error: ApiUnauthorized, cluster: str, identity: str, cause: str) -> TrainingRunError:
    """A 401/403 of EKS cluster `cluster` to `identity`, by its `cause` (`unauthorized_cause`), and what to do."""
    refused = f"EKS cluster {cluster} refused the AWS identity {identity} ({error.status} on {error.what})"
    if cause in ("expired", "invalid"):
        state = "have expired" if cause == "expired" else "are not valid (STS does not know the key)"
        return TrainingRunError(
            f"{refused}: its AWS credentials {state}, STS refuses them too, so this is not an access-entry "
            "problem. Renew them (`aws sso login`, new session keys, or aws:profile/aws:assumeRole, which "
            f"refresh themselves) and run `pulumi up` again. {JOB_KEEPS_RUNNING}"
        )
    if cause == "revoked":
        return TrainingRunError(
            f"{refused} after accepting it earlier in this run: its EKS access entry or access policy was "
            f"removed meanwhile (`aws eks list-access-entries --cluster-name {cluster}`). {JOB_KEEPS_RUNNING}"
        )
    return TrainingRunError(
        f"{refused}: that "
        f"identity needs an EKS access entry on the cluster (`aws eks create-access-entry --cluster-name {cluster} "
        "--principal-arn <IAM role or user ARN>`, then `aws eks associate-access-policy` with "
        "AmazonEKSClusterAdminPolicy), or run `pulumi up` as the identity that created the cluster "
        "(aws:profile, aws:assumeRole)"
    )


def explain_unreachable(error: ApiUnreachable, cluster: str) -> TrainingRunError:
    """A silent API endpoint: this machine's DNS, or the endpoint's access settings, and what to do."""
    if isinstance(error, EndpointNameUnresolved):
        return TrainingRunError(
            f"the name of the Kubernetes API endpoint of EKS cluster {cluster} ({error.endpoint}) does not resolve "
            f"({error.what}; {error.detail}): this machine's DNS or network is failing (a VPN, a proxy, no "
            f"connection), not the cluster's access settings; fix it and run `pulumi up` again. {JOB_KEEPS_RUNNING}"
        )
    return TrainingRunError(
        f"the Kubernetes API of EKS cluster {cluster} at {error.endpoint} did not answer {error.what} "
        f"({error.detail}). If this machine's public address is not in the stack's endpointPublicAccessCidrs, "
        "the endpoint silently drops its packets: add it as a /32 (`curl -s https://checkip.amazonaws.com`) to "
        "eks-ray-train:endpointPublicAccessCidrs and run `pulumi up` again; with endpointPublicAccess false, "
        "this machine must be inside the cluster's VPC or a network connected to it, admitted on 443 by the "
        "cluster security group"
    )


def explain_refused(error: ApiRefused, cluster: str) -> TrainingRunError:
    """An API that kept answering an error status: what the status says of the control plane."""
    if error.status == 429:
        cause = (
            "its API priority and fairness is shedding load (429 Too Many Requests, after waiting as "
            "Retry-After asked): the control plane is overloaded; wait a few minutes, look for a client "
            "flooding it, then run `pulumi up` again"
        )
    elif error.status >= 500:
        cause = (
            f"a server-side failure ({error.status}) of the control plane or the kubelet behind it, not this "
            "stack's settings; if it lasts, look at the node's health (`kubectl get nodes`) and run `pulumi up` again"
        )
    else:
        cause = f"the request was refused ({error.status}); run `pulumi up` again once the pod is running"
    return TrainingRunError(
        f"the Kubernetes API of EKS cluster {cluster} kept answering {error.status} to {error.what} "
        f"({error.detail}): {cause}. {JOB_KEEPS_RUNNING}"
    )


def explain_describe_cluster_failure(
    error: botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError,
    cluster: str,
    region: str,
    identity: str,
) -> TrainingRunError:
    """EKS's DescribeCluster of `cluster` in `region` as `identity` (the AWS settings described) failed."""
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            return TrainingRunError(f"EKS cluster {cluster} does not exist in {region}")
        return TrainingRunError(
            f"AWS refused DescribeCluster of EKS cluster {cluster} in {region} for "
            f"{identity}: {aws_refusal(error)}"
        )
    return TrainingRunError(
        f"the EKS API in {region} did not answer DescribeCluster of {cluster} as {identity}: {error}"
    )
