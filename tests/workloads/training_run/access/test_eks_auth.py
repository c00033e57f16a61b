"""EKS authentication: the presigned STS token and the API client built from DescribeCluster."""

from __future__ import annotations

import base64
import urllib.parse
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from kubernetes import client as k8s

from tests.harness.training_run_fakes import FakeClock
from workloads.training_run.access import eks_auth


@pytest.fixture
def aws_session(monkeypatch):
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    return boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG",
        region_name="us-east-2",
    )


def decode_token(token: str) -> urllib.parse.ParseResult:
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    body = token[len("k8s-aws-v1.") :]
    return urllib.parse.urlparse(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode())


def test_eks_token_is_a_presigned_get_caller_identity_bound_to_the_cluster(aws_session):
    url = decode_token(
        eks_auth.eks_token(aws_session.client("sts", region_name="us-east-2"), "eks-ray-train")
    )
    query = urllib.parse.parse_qs(url.query)
    assert url.hostname == "sts.us-east-2.amazonaws.com"
    assert query["Action"] == ["GetCallerIdentity"] and query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]


def test_the_api_client_comes_from_describe_cluster_and_refreshes_its_token(aws_session, monkeypatch):
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    eks = aws_session.client("eks", region_name="us-east-2")
    stubber = Stubber(eks)
    stubber.add_response(
        "describe_cluster",
        {
            "cluster": {
                "name": "eks-ray-train",
                "endpoint": "https://ABC.gr7.us-east-2.eks.amazonaws.com",
                "certificateAuthority": {"data": base64.b64encode(ca).decode()},
            }
        },
        {"name": "eks-ray-train"},
    )
    real_client = aws_session.client
    monkeypatch.setattr(
        aws_session, "client", lambda service, **kw: eks if service == "eks" else real_client(service, **kw)
    )
    with stubber, eks_auth.eks_api_client("eks-ray-train", "us-east-2", session=aws_session) as api_client:
        configuration = api_client.configuration
        assert configuration.host == "https://ABC.gr7.us-east-2.eks.amazonaws.com"
        ca_path = Path(configuration.ssl_ca_cert)
        assert ca_path.read_bytes() == ca
        header = configuration.auth_settings()["BearerToken"]["value"]
        assert header.startswith("Bearer k8s-aws-v1.")
    assert not ca_path.exists()


def test_the_token_is_signed_again_once_it_is_old(aws_session):
    clock = FakeClock()
    refresh = eks_auth.token_refresher(aws_session.client("sts", region_name="us-east-2"), "c", clock=clock)
    configuration = k8s.Configuration()
    refresh(configuration)
    first = configuration.api_key["authorization"]
    clock.sleep(eks_auth.REFRESH_AFTER_S - 1)
    refresh(configuration)
    assert configuration.api_key["authorization"] is first
    clock.sleep(2)
    refresh(configuration)
    assert configuration.api_key["authorization"] is not first
    decode_token(configuration.api_key["authorization"])
