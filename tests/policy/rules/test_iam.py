"""The IAM rules: IRSA trusts held to one service account and STS, hour-long service account tokens,
S3 rights held to prefixes, no AWS managed policy that grants the account or a whole service."""

from __future__ import annotations

import json

import pytest

from policy.rules import iam, properties
from tests.harness.policy_resources import UNKNOWN, case_ids, check_both_outcomes, check_case

ROLE = properties.ROLE
SA = properties.SERVICE_ACCOUNT
POLICY = properties.ROLE_POLICY
ATTACHMENT = properties.ROLE_POLICY_ATTACHMENT
AWS_POLICY = "arn:aws:iam::aws:policy/"
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


def attached(name: str, **props) -> dict:
    """A RolePolicyAttachment of the AWS managed policy `name` to the pods' role."""
    return {"role": "checkpoints-ray-pods", "policyArn": f"{AWS_POLICY}{name}", **props}


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
    # The trust's action by a wildcard, or every action but another (NotAction).
    (
        iam.irsa_trust_scoped,
        ROLE,
        trust({"StringEquals": {f"{ISSUER}:aud": "sts.amazonaws.com"}}, "sts:AssumeRoleWith*"),
        "dev",
        "admits every service account of the cluster",
    ),
    (
        iam.irsa_trust_scoped,
        ROLE,
        {
            "assumeRolePolicy": json.dumps(
                {
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Federated": PROVIDER},
                            "NotAction": "sts:TagSession",
                            "Condition": {"StringEquals": {f"{ISSUER}:aud": "sts.amazonaws.com"}},
                        }
                    ]
                }
            )
        },
        "dev",
        "admits every service account of the cluster",
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
    # What the node roles, the VPC CNI's and the CloudWatch agent's hold.
    (iam.s3_access_prefix_scoped, ATTACHMENT, attached("AmazonEKSWorkerNodePolicy"), "dev", None),
    (iam.s3_access_prefix_scoped, ATTACHMENT, attached("CloudWatchAgentServerPolicy"), "dev", None),
    (iam.s3_access_prefix_scoped, ATTACHMENT, {"role": "r", "policyArn": UNKNOWN}, "dev", None),
    # Every action but S3's, or S3 on every resource but the buckets': nothing of S3 on a bucket.
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy({"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"}),
        "dev",
        None,
    ),
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy({"Effect": "Allow", "Action": "s3:GetObject", "NotResource": "arn:aws:s3:::*"}),
        "dev",
        None,
    ),
    # The wide grants: AWS managed policies that allow S3 on every bucket, on the pods' role.
    (
        iam.s3_access_prefix_scoped,
        ATTACHMENT,
        attached("AmazonS3FullAccess"),
        "dev",
        "the attachment gives its role the AWS managed policy AmazonS3FullAccess, which allows S3 on every "
        "bucket of the account: detach it",
    ),
    (
        iam.s3_access_prefix_scoped,
        ROLE,
        {"managedPolicyArns": [f"{AWS_POLICY}AmazonS3ReadOnlyAccess"]},
        "dev",
        "the role holds the AWS managed policy AmazonS3ReadOnlyAccess",
    ),
    (
        iam.s3_access_prefix_scoped,
        properties.POLICY_ATTACHMENT,
        {"roles": ["r"], "policyArn": f"{AWS_POLICY}AdministratorAccess"},
        "dev",
        "AdministratorAccess, which allows S3 on every bucket",
    ),
    (
        iam.s3_access_prefix_scoped,
        properties.ROLE_POLICY_ATTACHMENTS_EXCLUSIVE,
        {"roleName": "r", "policyArns": [f"{AWS_POLICY}PowerUserAccess"]},
        "dev",
        "PowerUserAccess, which allows S3 on every bucket",
    ),
    # Every action but IAM's (NotAction), every resource but one (NotResource): unscoped.
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": f"{BUCKET}/*", "Sid": "AllButIam"}),
        "dev",
        "statement AllButIam allows every action but iam:* (NotAction) on arn:aws:s3:::ckpt/*: every object",
    ),
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy({"Effect": "Allow", "Action": "s3:GetObject", "NotResource": f"{BUCKET}/secrets/*"}),
        "dev",
        "allows s3:GetObject on every resource but arn:aws:s3:::ckpt/secrets/* (NotResource): every object",
    ),
    # An action's case, and wildcards, as IAM reads them.
    (
        iam.s3_access_prefix_scoped,
        POLICY,
        policy(allow("S3:GETOBJECT", f"{BUCKET}/*")),
        "dev",
        "every object",
    ),
    (iam.s3_access_prefix_scoped, POLICY, policy(allow("s3:*Bucket", BUCKET)), "dev", "for any prefix"),
    # iam-no-wide-managed-policies
    (iam.iam_no_wide_managed_policies, ATTACHMENT, attached("AmazonEKSWorkerNodePolicy"), "dev", None),
    (
        iam.iam_no_wide_managed_policies,
        ATTACHMENT,
        attached("AmazonEC2ContainerRegistryPullOnly"),
        "dev",
        None,
    ),
    (iam.iam_no_wide_managed_policies, ATTACHMENT, attached("CloudWatchAgentServerPolicy"), "dev", None),
    (iam.iam_no_wide_managed_policies, ATTACHMENT, attached("AmazonEKS_CNI_Policy"), "dev", None),
    (iam.iam_no_wide_managed_policies, ATTACHMENT, attached("AmazonS3ReadOnlyAccess"), "dev", None),
    # A customer managed policy's name is the stack's own to choose.
    (
        iam.iam_no_wide_managed_policies,
        ATTACHMENT,
        {"role": "r", "policyArn": "arn:aws:iam::123456789012:policy/CheckpointsFullAccess"},
        "dev",
        None,
    ),
    (iam.iam_no_wide_managed_policies, ROLE, {"managedPolicyArns": UNKNOWN}, "dev", None),
    (
        iam.iam_no_wide_managed_policies,
        ATTACHMENT,
        attached("AmazonS3FullAccess"),
        "dev",
        "the attachment gives its role the AWS managed policy AmazonS3FullAccess, which grants every action of "
        "a service on all its resources: detach it",
    ),
    (
        iam.iam_no_wide_managed_policies,
        ROLE,
        {"managedPolicyArns": [f"{AWS_POLICY}AmazonEKSWorkerNodePolicy", f"{AWS_POLICY}AdministratorAccess"]},
        "dev",
        "the role holds the AWS managed policy AdministratorAccess, which grants every action on every resource",
    ),
    (
        iam.iam_no_wide_managed_policies,
        properties.POLICY_ATTACHMENT,
        {"roles": ["r"], "policyArn": f"{AWS_POLICY}PowerUserAccess"},
        "dev",
        "the attachment gives its roles, users and groups the AWS managed policy PowerUserAccess",
    ),
    (
        iam.iam_no_wide_managed_policies,
        properties.ROLE_POLICY_ATTACHMENTS_EXCLUSIVE,
        {
            "roleName": "r",
            "policyArns": [f"{AWS_POLICY}AmazonEKSWorkerNodePolicy", f"{AWS_POLICY}IAMFullAccess"],
        },
        "dev",
        "the attachments give their role the AWS managed policy IAMFullAccess",
    ),
    (
        iam.iam_no_wide_managed_policies,
        ATTACHMENT,
        {"role": "r", "policyArn": "arn:aws-us-gov:iam::aws:policy/service-role/AmazonEC2FullAccess"},
        "dev",
        "AmazonEC2FullAccess",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(iam, CASES)


def test_an_allow_of_every_action_but_iam_is_refused_on_objects_and_on_listing():
    """Every action but IAM's on every resource: all of S3 among the rest."""
    props = policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})
    assert iam.s3_access_prefix_scoped.check(POLICY, props, "dev") == [
        "a statement of the policy allows every action but iam:* (NotAction) on *: every object of the bucket;"
        " name the prefixes the workload uses (arn:aws:s3:::<bucket>/<prefix>/*)",
        "a statement of the policy allows every action but iam:* (NotAction) on * for any prefix: add a condition "
        "StringLike (or StringLikeIfExists) s3:prefix naming the workload's prefixes",
    ]


def test_the_pods_role_with_a_wide_managed_policy_is_refused_by_both_rules():
    """AmazonS3FullAccess on the pods' role: every bucket of the account, and all of S3."""
    props = attached("AmazonS3FullAccess")
    assert len(iam.s3_access_prefix_scoped.check(ATTACHMENT, props, "dev")) == 1
    assert len(iam.iam_no_wide_managed_policies.check(ATTACHMENT, props, "dev")) == 1
