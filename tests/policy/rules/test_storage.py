"""The rules of buckets and logs: TLS-only and versioned buckets reached through the VPC's S3 endpoint
and encrypted with a key of their own, log groups with a retention and a KMS key."""

from __future__ import annotations

import json

import pytest

from policy.rules import eks, properties, storage
from policy.rules.properties import StackResource
from tests.harness.policy_resources import (
    AWS_EKS,
    EKS,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
)

ALL_LOGS = list(eks.CONTROL_PLANE_LOG_TYPES)

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # log-groups-kms-encrypted (advisory)
    (
        storage.log_groups_kms_encrypted,
        properties.LOG_GROUP,
        {"kmsKeyId": "arn:aws:kms:us-east-2:1:key/k"},
        "dev",
        None,
    ),
    (storage.log_groups_kms_encrypted, properties.LOG_GROUP, {"kmsKeyId": UNKNOWN}, "dev", None),
    (storage.log_groups_kms_encrypted, properties.LOG_GROUP, {"retentionInDays": 30}, "dev", "no kmsKeyId"),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(storage, CASES)


BUCKET = "aws:s3/bucket:Bucket"


ARN = "arn:aws:s3:::ckpt"


TLS_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [ARN, f"{ARN}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    ],
}


def bucket_policy(document, dependencies=("urn:bucket",), **props) -> StackResource:
    policy = document if isinstance(document, str) else json.dumps(document)
    return StackResource(
        properties.BUCKET_POLICY, "urn:policy", {"bucket": UNKNOWN, "policy": policy, **props}, dependencies
    )


def tls_statement(**changes) -> dict:
    return {**TLS_ONLY, "Statement": [{**TLS_ONLY["Statement"][0], **changes}]}


CKPT_BUCKET = StackResource(BUCKET, "urn:bucket", {"bucket": "ckpt"}, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY)], None),
        ([CKPT_BUCKET, bucket_policy(UNKNOWN)], None),
        # An update's preview: linked by the known bucket name.
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY, dependencies=(), bucket="ckpt")], None),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Action=["s3:GetObject", "*"]))], None),
        ([CKPT_BUCKET], "has no bucket policy"),
        ([CKPT_BUCKET, bucket_policy(TLS_ONLY, dependencies=("urn:other",))], "has no bucket policy"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Effect="Allow"))], "does not deny plain HTTP"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Resource=[ARN]))], "does not deny plain HTTP"),
        ([CKPT_BUCKET, bucket_policy(tls_statement(Action="s3:GetObject"))], "does not deny plain HTTP"),
        (
            [CKPT_BUCKET, bucket_policy(tls_statement(Condition={"Bool": {"aws:SecureTransport": "true"}}))],
            "does not deny plain HTTP",
        ),
    ],
)
def test_buckets_tls_only(resources, expected):
    violations = storage.buckets_tls_only.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1]


def log_group(name="/aws/eks/c/cluster", **props) -> StackResource:
    return StackResource(properties.LOG_GROUP, f"urn:lg-{name}", {"name": name, **props}, ())


LOGGING_CLUSTER = StackResource(EKS, "urn:eks", {"name": "c", "enabledClusterLogTypes": ALL_LOGS}, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([LOGGING_CLUSTER, log_group(retentionInDays=30.0)], None),
        ([LOGGING_CLUSTER, log_group(retentionInDays=UNKNOWN)], None),
        ([StackResource(EKS, "urn:eks", {"name": "c"}, ())], None),
        ([StackResource(AWS_EKS, "urn:eks", {"name": UNKNOWN, "enabledClusterLogTypes": ["api"]}, ())], None),
        ([LOGGING_CLUSTER, log_group()], "no retentionInDays"),
        ([LOGGING_CLUSTER, log_group(retentionInDays=0)], "no retentionInDays"),
        ([LOGGING_CLUSTER, log_group("/aws/eks/other/cluster", retentionInDays=7)], "/aws/eks/c/cluster"),
        ([LOGGING_CLUSTER], "which is not in the stack"),
    ],
)
def test_log_retention(resources, expected):
    violations = storage.log_retention.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations


VERSIONING = properties.BUCKET_VERSIONING[0]


@pytest.mark.parametrize(
    "resources, expected",
    [
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": "Enabled"}}, ("urn:bucket",)
                ),
            ],
            None,
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING,
                    "urn:v",
                    {"bucket": "ckpt", "versioningConfiguration": {"status": "Enabled"}},
                    (),
                ),
            ],
            None,
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": UNKNOWN}}, ("urn:bucket",)
                ),
            ],
            None,
        ),
        ([StackResource(BUCKET, "urn:bucket", {"versioning": {"enabled": "true"}}, ())], None),
        ([CKPT_BUCKET], "does not keep versions"),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING, "urn:v", {"versioningConfiguration": {"status": "Suspended"}}, ("urn:bucket",)
                ),
            ],
            "does not keep versions",
        ),
        (
            [
                CKPT_BUCKET,
                StackResource(
                    VERSIONING,
                    "urn:v",
                    {"bucket": "other", "versioningConfiguration": {"status": "Enabled"}},
                    (),
                ),
            ],
            "does not keep versions",
        ),
    ],
)
def test_buckets_versioned(resources, expected):
    violations = storage.buckets_versioned.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1]


ENDPOINT = StackResource(
    properties.VPC_ENDPOINT,
    "urn:vpce",
    {"vpcEndpointType": "Gateway", "serviceName": "com.amazonaws.us-east-2.s3", "routeTableIds": ["rtb-1"]},
    (),
)
VPCE_ONLY = {
    "Effect": "Deny",
    "Principal": "*",
    "Action": "s3:*",
    "Resource": [ARN, f"{ARN}/*"],
    "Condition": {
        "ArnEquals": {"aws:PrincipalArn": "arn:aws:iam::1:role/ray-pods"},
        "StringNotEquals": {"aws:SourceVpce": "vpce-1"},
    },
}


def guarded(*statements: dict) -> dict:
    return {**TLS_ONLY, "Statement": [*TLS_ONLY["Statement"], *statements]}


def endpoint(**props) -> StackResource:
    return StackResource(ENDPOINT.type, ENDPOINT.urn, {**ENDPOINT.props, **props}, ())


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([CKPT_BUCKET, ENDPOINT, bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce"))], None),
        # An update's preview: the endpoint linked by its id.
        ([CKPT_BUCKET, endpoint(id="vpce-1"), bucket_policy(guarded(VPCE_ONLY))], None),
        ([CKPT_BUCKET, ENDPOINT, bucket_policy(UNKNOWN)], None),
        (
            [
                CKPT_BUCKET,
                ENDPOINT,
                bucket_policy(
                    guarded({**VPCE_ONLY, "Condition": {"StringNotEquals": {"aws:SourceVpce": UNKNOWN}}})
                ),
            ],
            None,
        ),
        (
            [
                CKPT_BUCKET,
                endpoint(routeTableIds=UNKNOWN),
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce")),
            ],
            None,
        ),
        ([CKPT_BUCKET, ENDPOINT], "has no bucket policy"),
        (
            [CKPT_BUCKET, ENDPOINT, bucket_policy(TLS_ONLY)],
            "has no statement denying requests that do not come",
        ),
        (
            [
                CKPT_BUCKET,
                ENDPOINT,
                bucket_policy(guarded({**VPCE_ONLY, "Effect": "Allow"}), ("urn:bucket", "urn:vpce")),
            ],
            "has no statement denying",
        ),
        (
            [
                CKPT_BUCKET,
                ENDPOINT,
                bucket_policy(guarded({**VPCE_ONLY, "Resource": [ARN]}), ("urn:bucket", "urn:vpce")),
            ],
            "has no statement denying",
        ),
        (
            [CKPT_BUCKET, bucket_policy(guarded(VPCE_ONLY))],
            "requires vpce-1, which is no S3 gateway endpoint of the stack on a route table:",
        ),
        (
            [
                CKPT_BUCKET,
                endpoint(routeTableIds=[]),
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce")),
            ],
            "no S3 gateway endpoint of the stack on a route table",
        ),
        (
            [
                CKPT_BUCKET,
                endpoint(vpcEndpointType="Interface"),
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce")),
            ],
            "no S3 gateway endpoint",
        ),
        (
            [
                CKPT_BUCKET,
                endpoint(serviceName="com.amazonaws.us-east-2.dynamodb"),
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce")),
            ],
            "no S3 gateway endpoint",
        ),
        ([CKPT_BUCKET, endpoint(id="vpce-2"), bucket_policy(guarded(VPCE_ONLY))], "no S3 gateway endpoint"),
    ],
)
def test_buckets_vpc_endpoint_only(resources, expected):
    violations = storage.buckets_vpc_endpoint_only.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1], (
            violations
        )


PODS_ARN = "arn:aws:iam::1:role/ray-pods"


def role(urn: str = "urn:pods-role", dependencies: tuple[str, ...] = (), **props) -> StackResource:
    return StackResource(properties.ROLE, urn, props, dependencies)


def document(*statements: dict) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


READ_THE_RUNS = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{ARN}/runs/*"}
# The pods' role as an update's preview shows it (its ARN known), and its access to the runs.
PODS_ROLE = role(name="ray-pods", arn=PODS_ARN)
PODS_ACCESS = StackResource(
    properties.ROLE_POLICY, "urn:pods-access", {"role": "ray-pods", "policy": document(READ_THE_RUNS)}, ()
)


def deny_outside_endpoint(**condition) -> dict:
    """VPCE_ONLY with its principal condition replaced by `condition` (none: every principal)."""
    return {**VPCE_ONLY, "Condition": {"StringNotEquals": {"aws:SourceVpce": "vpce-1"}, **condition}}


def guarded_stack(*statements: dict, grants: tuple[StackResource, ...] = (PODS_ROLE, PODS_ACCESS)) -> list:
    """The bucket, its endpoint (vpce-1), the roles the stack grants on it, and its policy of `statements`."""
    return [CKPT_BUCKET, endpoint(id="vpce-1"), *grants, bucket_policy(guarded(*statements))]


# A role of a first preview: its URN, nothing else known.
UNNAMED_ROLE = "urn:pulumi:dev::eks-ray-train::aws:iam/role:Role::ray-pods"
NODE_ROLE = role("urn:node-role", name="node", arn="arn:aws:iam::1:role/node")


@pytest.mark.parametrize(
    "resources, expected",
    [
        (guarded_stack(VPCE_ONLY), None),
        (
            guarded_stack(deny_outside_endpoint(ArnLike={"aws:PrincipalArn": "arn:aws:iam::*:role/ray-*"})),
            None,
        ),
        (guarded_stack(deny_outside_endpoint()), None),
        (guarded_stack({**deny_outside_endpoint(), "Principal": {"AWS": [PODS_ARN]}}), None),
        # Everyone but the administrators' role, and requests AWS services make for a principal.
        (
            guarded_stack(
                deny_outside_endpoint(
                    ArnNotLike={"aws:PrincipalArn": "arn:aws:iam::1:role/admin-*"},
                    Bool={"aws:ViaAWSService": "false"},
                )
            ),
            None,
        ),
        # The role known by its name alone; and by nothing, with the policy built from its ARN (first preview).
        (guarded_stack(VPCE_ONLY, grants=(role(name="ray-pods"), PODS_ACCESS)), None),
        (
            [
                CKPT_BUCKET,
                endpoint(),
                role(),
                StackResource(
                    properties.ROLE_POLICY,
                    "urn:pods-access",
                    {"role": UNKNOWN, "policy": document(READ_THE_RUNS)},
                    ("urn:pods-role",),
                ),
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce", "urn:pods-role")),
            ],
            None,
        ),
        # A role that may not touch the bucket needs no denial.
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    NODE_ROLE,
                    StackResource(
                        properties.ROLE_POLICY_ATTACHMENT,
                        "urn:node-pull",
                        {
                            "role": "node",
                            "policyArn": "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
                        },
                        (),
                    ),
                ),
            ),
            None,
        ),
        # A denial whose condition, or principal, is not known yet: the next run judges it.
        (guarded_stack({**VPCE_ONLY, "Condition": UNKNOWN}), None),
        (guarded_stack({**VPCE_ONLY, "Principal": UNKNOWN}), None),
        # The wide grants each Deny must name: a typo in the role's ARN.
        (
            guarded_stack(
                deny_outside_endpoint(ArnEquals={"aws:PrincipalArn": "arn:aws:iam::1:role/ray-pod"})
            ),
            "the bucket's policy denies requests that do not come through the S3 endpoint only to aws:PrincipalArn "
            f"arn:aws:iam::1:role/ray-pod, not to role {PODS_ARN}, which the stack allows on the bucket: name every "
            "role the stack allows on the bucket in the statement's ArnEquals aws:PrincipalArn",
        ),
        # AmazonS3FullAccess on another role: every bucket, this one included.
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    NODE_ROLE,
                    StackResource(
                        properties.ROLE_POLICY_ATTACHMENT,
                        "urn:node-s3",
                        {"role": "node", "policyArn": "arn:aws:iam::aws:policy/AmazonS3FullAccess"},
                        (),
                    ),
                ),
            ),
            "not to role arn:aws:iam::1:role/node, which the stack allows on the bucket",
        ),
        # AmazonS3FullAccess through a PolicyAttachment, and a RolePolicyAttachmentsExclusive.
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    NODE_ROLE,
                    StackResource(
                        properties.POLICY_ATTACHMENT,
                        "urn:s3-everywhere",
                        {"roles": ["node"], "policyArn": "arn:aws:iam::aws:policy/AmazonS3FullAccess"},
                        (),
                    ),
                ),
            ),
            "not to role arn:aws:iam::1:role/node, which the stack allows on the bucket",
        ),
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    StackResource(
                        properties.ROLE_POLICY_ATTACHMENTS_EXCLUSIVE,
                        "urn:outside",
                        {
                            "roleName": "ci-deployer",
                            "policyArns": ["arn:aws:iam::aws:policy/AdministratorAccess"],
                        },
                        (),
                    ),
                ),
            ),
            "not to role ci-deployer, which the stack allows on the bucket",
        ),
        # Every action but IAM's on every resource, inline in another role; a customer managed policy.
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    role(
                        "urn:node-role",
                        name="node",
                        arn="arn:aws:iam::1:role/node",
                        inlinePolicies=[
                            {
                                "name": "all",
                                "policy": document(
                                    {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}
                                ),
                            }
                        ],
                    ),
                ),
            ),
            "not to role arn:aws:iam::1:role/node",
        ),
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    PODS_ROLE,
                    PODS_ACCESS,
                    NODE_ROLE,
                    StackResource(
                        properties.IAM_POLICY, "urn:ckpt-read", {"policy": document(READ_THE_RUNS)}, ()
                    ),
                    StackResource(
                        properties.ROLE_POLICY_ATTACHMENT,
                        "urn:node-ckpt-read",
                        {"role": "node", "policyArn": UNKNOWN},
                        ("urn:ckpt-read",),
                    ),
                ),
            ),
            "not to role arn:aws:iam::1:role/node",
        ),
        # The bucket policy's own Allow to everyone.
        (
            guarded_stack(
                VPCE_ONLY,
                {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"{ARN}/*"},
            ),
            'not to every principal (an Allow to Principal "*")',
        ),
        # A denial that spares the pods' role, or that other conditions narrow.
        (
            guarded_stack(deny_outside_endpoint(ArnNotEquals={"aws:PrincipalArn": PODS_ARN})),
            f"only to principals other than {PODS_ARN}, not to role {PODS_ARN}",
        ),
        (
            guarded_stack(
                deny_outside_endpoint(
                    ArnEquals={"aws:PrincipalArn": PODS_ARN}, StringEquals={"aws:PrincipalTag/team": "ml"}
                )
            ),
            "only under conditions the pack does not read (StringEquals aws:PrincipalTag/team), not to role "
            f"{PODS_ARN}, which the stack allows on the bucket: leave out of the statement every condition but "
            "aws:SourceVpce and aws:PrincipalArn",
        ),
        # The role's ARN unknown, and the policy not built from it: the pack cannot show it is denied.
        (
            guarded_stack(
                VPCE_ONLY,
                grants=(
                    role(UNNAMED_ROLE),
                    StackResource(
                        properties.ROLE_POLICY,
                        "urn:pods-access",
                        {"role": UNKNOWN, "policy": document(READ_THE_RUNS)},
                        (UNNAMED_ROLE,),
                    ),
                ),
            ),
            "the bucket's policy may not deny role ray-pods requests that do not come through the S3 endpoint: the "
            "stack allows it on the bucket, and its ARN, unknown until it is created, cannot be matched",
        ),
        # The endpoint the statement names is not the stack's, though the policy depends on the stack's.
        (
            [
                CKPT_BUCKET,
                endpoint(id="vpce-2"),
                PODS_ROLE,
                PODS_ACCESS,
                bucket_policy(guarded(VPCE_ONLY), ("urn:bucket", "urn:vpce")),
            ],
            "requires vpce-1, which is no S3 gateway endpoint of the stack on a route table (the stack's: vpce-2)",
        ),
    ],
)
def test_buckets_vpc_endpoint_only_denies_every_principal_the_stack_lets_in(resources, expected):
    violations = storage.buckets_vpc_endpoint_only.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1], (
            violations
        )
        assert "\n" not in violations[0][1]


ENCRYPTION = properties.BUCKET_ENCRYPTION[0]


def encryption(default: dict | str, dependencies=("urn:bucket",), **props) -> StackResource:
    rules = [{"applyServerSideEncryptionByDefault": default, "bucketKeyEnabled": True}]
    return StackResource(ENCRYPTION, "urn:sse", {"bucket": UNKNOWN, "rules": rules, **props}, dependencies)


KEY_ARN = "arn:aws:kms:us-east-2:1:key/k"


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms", "kmsMasterKeyId": KEY_ARN})], None),
        ([CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms", "kmsMasterKeyId": UNKNOWN})], None),
        ([CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms:dsse", "kmsMasterKeyId": KEY_ARN})], None),
        ([CKPT_BUCKET, encryption(UNKNOWN)], None),
        (
            [
                CKPT_BUCKET,
                encryption({"sseAlgorithm": "aws:kms", "kmsMasterKeyId": KEY_ARN}, (), bucket="ckpt"),
            ],
            None,
        ),
        (
            [
                StackResource(
                    BUCKET,
                    "urn:bucket",
                    {
                        "serverSideEncryptionConfiguration": {
                            "rule": {
                                "applyServerSideEncryptionByDefault": {
                                    "sseAlgorithm": "aws:kms",
                                    "kmsMasterKeyId": KEY_ARN,
                                }
                            }
                        }
                    },
                    (),
                )
            ],
            None,
        ),
        ([CKPT_BUCKET], "does not encrypt with a key of its own"),
        ([CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms"})], "does not encrypt with a key of its own"),
        ([CKPT_BUCKET, encryption({"sseAlgorithm": "AES256"})], "does not encrypt with a key of its own"),
        (
            [CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms", "kmsMasterKeyId": "alias/aws/s3"})],
            "does not encrypt with a key of its own",
        ),
        (
            [CKPT_BUCKET, encryption({"sseAlgorithm": "aws:kms", "kmsMasterKeyId": KEY_ARN}, ("urn:other",))],
            "does not encrypt with a key of its own",
        ),
    ],
)
def test_buckets_kms_cmk(resources, expected):
    violations = storage.buckets_kms_cmk.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:bucket" and expected in violations[0][1], (
            violations
        )
