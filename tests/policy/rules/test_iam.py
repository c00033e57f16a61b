"""The IAM rules: IRSA trusts held to one service account and STS, hour-long service account tokens,
S3 rights held to prefixes."""

from __future__ import annotations

import json

import pytest

from policy.rules import iam, properties
from tests.harness.policy_resources import UNKNOWN, case_ids, check_both_outcomes, check_case

ROLE = properties.ROLE
SA = properties.SERVICE_ACCOUNT
POLICY = properties.ROLE_POLICY
ISSUER = "oidc.eks.us-east-2.amazonaws.com/id/ABC"
PROVIDER = f"arn:aws:iam::123456789012:oidc-provider/{ISSUER}"
BUCKET = "arn:aws:s3:::ckpt"


def trust(condition: dict | str, action: str = "sts:AssumeRoleWithWebIdentity", principal=None) -> dict:
    statement = {
        "Effect": "Allow",
        "Principal": principal or {"Federated": PROVIDER},
        "Action": action,
        "Condition": condition,
    }
    return {"assumeRolePolicy": json.dumps({"Version": "2012-10-17", "Statement": [statement]})}


SCOPED = {
    "StringEquals": {
        f"{ISSUER}:sub": "system:serviceaccount:kube-system:aws-node",
        f"{ISSUER}:aud": "sts.amazonaws.com",
    }
}


def service_account(**annotations) -> dict:
    return {
        "metadata": {
            "name": "ray-train",
            "annotations": {"eks.amazonaws.com/role-arn": "arn:r", **annotations},
        }
    }


def policy(*statements: dict) -> dict:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}


def allow(action, resource, **extra) -> dict:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


PREFIXED_LIST = allow(
    "s3:ListBucket", BUCKET, Condition={"StringLikeIfExists": {"s3:prefix": ["runs", "runs/*"]}}
)

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # irsa-trust-scoped
    (iam.irsa_trust_scoped, ROLE, trust(SCOPED), "dev", None),
    (iam.irsa_trust_scoped, ROLE, {"assumeRolePolicy": UNKNOWN}, "dev", None),
    (iam.irsa_trust_scoped, ROLE, trust({"StringEquals": UNKNOWN}), "dev", None),
    # An EC2 instance role is not a web identity's.
    (iam.irsa_trust_scoped, ROLE, trust({}, "sts:AssumeRole", {"Service": "ec2.amazonaws.com"}), "dev", None),
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust({"StringEquals": {f"{ISSUER}:aud": "sts.amazonaws.com"}}),
        "dev",
        "admits every service account of the cluster",
    ),
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust(
            {
                "StringEquals": {f"{ISSUER}:aud": "sts.amazonaws.com"},
                "StringLike": {f"{ISSUER}:sub": "system:serviceaccount:kube-system:*"},
            }
        ),
        "dev",
        "admits every service account of the cluster",
    ),
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust(
            {
                "StringEquals": {
                    f"{ISSUER}:sub": "system:serviceaccount:kube-system",
                    f"{ISSUER}:aud": "sts.amazonaws.com",
                }
            }
        ),
        "dev",
        "not one service account",
    ),
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust({"StringEquals": {f"{ISSUER}:sub": "system:serviceaccount:kube-system:aws-node"}}),
        "dev",
        "audience to STS",
    ),
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust({"StringEquals": {**SCOPED["StringEquals"], f"{ISSUER}:aud": "other"}}),
        "dev",
        "audience to STS",
    ),
    # irsa-token-lifetime
    (
        iam.irsa_token_lifetime,
        SA,
        service_account(**{"eks.amazonaws.com/token-expiration": "3600"}),
        "dev",
        None,
    ),
    (
        iam.irsa_token_lifetime,
        SA,
        service_account(**{"eks.amazonaws.com/token-expiration": "600"}),
        "dev",
        None,
    ),
    (
        iam.irsa_token_lifetime,
        SA,
        service_account(**{"eks.amazonaws.com/token-expiration": UNKNOWN}),
        "dev",
        None,
    ),
    (iam.irsa_token_lifetime, SA, {"metadata": {"name": "no-role"}}, "dev", None),
    (iam.irsa_token_lifetime, SA, service_account(), "dev", "the webhook's default 86400 s"),
    (
        iam.irsa_token_lifetime,
        SA,
        service_account(**{"eks.amazonaws.com/token-expiration": "86400"}),
        "dev",
        "token-expiration is '86400'",
    ),
    (
        iam.irsa_token_lifetime,
        SA,
        service_account(**{"eks.amazonaws.com/token-expiration": "1h"}),
        "dev",
        "token-expiration is '1h'",
    ),
    # s3-access-prefix-scoped
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy(
            PREFIXED_LIST, allow(["s3:GetObject", "s3:PutObject"], [f"{BUCKET}/runs", f"{BUCKET}/runs/*"])
        ),
        "dev",
        None,
    ),
    (iam.s3_access_prefix_scoped, POLICY, {"policy": UNKNOWN}, "dev", None),
    (iam.s3_access_prefix_scoped, POLICY, policy(allow("cloudwatch:PutMetricData", "*")), "dev", None),
    (iam.s3_access_prefix_scoped, POLICY, policy(allow("s3:GetBucketLocation", BUCKET)), "dev", None),
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy({**allow("s3:*", f"{BUCKET}/*"), "Effect": "Deny"}),
        "dev",
        None,
    ),
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy(allow(["s3:GetObject", "s3:PutObject"], f"{BUCKET}/*", Sid="Checkpoints")),
        "dev",
        "statement Checkpoints allows s3:GetObject, s3:PutObject on arn:aws:s3:::ckpt/*: every object",
    ),
    (iam.s3_access_prefix_scoped, POLICY, policy(allow("s3:GetObject", "*")), "dev", "every object"),
    (iam.s3_access_prefix_scoped, POLICY, policy(allow("s3:ListBucket", BUCKET)), "dev", "for any prefix"),
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy(allow("s3:ListBucket", BUCKET, Condition={"StringLike": {"s3:prefix": "*"}})),
        "dev",
        "for any prefix",
    ),
    (
        iam.s3_access_prefix_scoped,
        ROLE,
        {"inlinePolicies": [{"name": "ckpt", **policy(allow("s3:GetObject", f"{BUCKET}/*"))}]},
        "dev",
        "every object",
    ),
    (
        iam.s3_access_prefix_scoped,
        properties.IAM_POLICY,
        policy(allow("s3:List*", BUCKET)),
        "dev",
        "for any prefix",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(iam, CASES)
