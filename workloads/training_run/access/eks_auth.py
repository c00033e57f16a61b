"""A Kubernetes API client for an EKS cluster, built from its name and region alone.

The training run's dynamic provider must reach the cluster without a kubeconfig or token in its
inputs: whatever a dynamic resource receives is written to the Pulumi state. So the provider
asks EKS for the endpoint and CA (`eks:DescribeCluster`) and signs its own bearer token with
the ambient AWS credentials, the way `aws eks get-token` does:

    token = "k8s-aws-v1." + base64url(presigned STS GetCallerIdentity URL), padding stripped

The URL is signed with the `x-k8s-aws-id: <cluster name>` header, so it is good for that
cluster only; EKS accepts it for 15 minutes after signing. A run can last an hour, so the
client re-signs before each request once the token is `REFRESH_AFTER_S` old. Nothing here
persists: the CA goes to a temporary file removed when the context exits.

Every call is bounded: `DescribeCluster` by botocore's timeouts and standard retries, the
Kubernetes calls by `ApiTimeouts` (urllib3 retries a failed REST connection; `KubernetesCluster`
retries an answer that may pass, and the exec retries itself).
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator

import boto3
import botocore.config
import kubernetes.client
from urllib3.util.retry import Retry

from workloads.training_run.access.call_bounds import DEFAULT_TIMEOUTS, ApiTimeouts

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
# What `aws eks get-token` uses; EKS itself bounds a token's life to 15 minutes from signing.
PRESIGN_EXPIRES_S = 60
REFRESH_AFTER_S = 10 * 60


def eks_token(sts_client, cluster_name: str) -> str:
    """Bearer token for `cluster_name` from a presigned STS GetCallerIdentity URL."""

    def add_cluster_header(request, **_):
        request.headers[CLUSTER_ID_HEADER] = cluster_name

    event = "before-sign.sts.GetCallerIdentity"
    sts_client.meta.events.register(event, add_cluster_header)
    try:
        url = sts_client.generate_presigned_url(
            "get_caller_identity", Params={}, ExpiresIn=PRESIGN_EXPIRES_S, HttpMethod="GET"
        )
    finally:
        sts_client.meta.events.unregister(event, add_cluster_header)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def token_refresher(
    sts_client, cluster_name: str, clock: Callable[[], float] = time.monotonic
) -> Callable[[kubernetes.client.Configuration], None]:
    """A `refresh_api_key_hook`: re-signs the token once it is `REFRESH_AFTER_S` old."""
    signed_at: list[float] = []

    def refresh(configuration: kubernetes.client.Configuration) -> None:
        now = clock()
        if not signed_at or now - signed_at[0] >= REFRESH_AFTER_S:
            configuration.api_key["authorization"] = eks_token(sts_client, cluster_name)
            signed_at[:] = [now]

    return refresh


def aws_client_config(timeouts: ApiTimeouts) -> botocore.config.Config:
    """The same bounds for AWS calls as for Kubernetes calls."""
    return botocore.config.Config(
        connect_timeout=timeouts.connect_s,
        read_timeout=timeouts.read_s,
        retries={"mode": "standard", "max_attempts": timeouts.attempts},
    )


@contextlib.contextmanager
def eks_api_client(
    cluster_name: str, region: str, session: boto3.session.Session, timeouts: ApiTimeouts = DEFAULT_TIMEOUTS
) -> Iterator[kubernetes.client.ApiClient]:
    """An `ApiClient` for the cluster, valid inside the `with` block."""
    eks = session.client("eks", region_name=region, config=aws_client_config(timeouts))
    cluster = eks.describe_cluster(name=cluster_name)["cluster"]
    sts_client = session.client("sts", region_name=region)
    with tempfile.NamedTemporaryFile("wb", prefix="eks-ca-", suffix=".crt", delete=False) as ca_file:
        ca_file.write(base64.b64decode(cluster["certificateAuthority"]["data"]))
    try:
        configuration = kubernetes.client.Configuration()
        configuration.host = cluster["endpoint"]
        configuration.ssl_ca_cert = ca_file.name
        configuration.api_key_prefix["authorization"] = "Bearer"
        # Connections only: an answer such as 429 or 500 is retried by `KubernetesCluster._call`,
        # which caps `Retry-After`, can be interrupted, and names the status when it gives up.
        configuration.retries = Retry(total=timeouts.attempts - 1, backoff_factor=0.5, status_forcelist=())
        refresh = token_refresher(sts_client, cluster_name)
        # The client asks the hook only when a key is already set: sign the first token now.
        refresh(configuration)
        configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed None in the client
        with kubernetes.client.ApiClient(configuration) as api_client:
            yield api_client
    finally:
        os.unlink(ca_file.name)
