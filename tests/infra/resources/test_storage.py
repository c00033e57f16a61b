"""The checkpoint bucket in the program's plan: TLS only, the pods' role only through the VPC's S3
endpoint and only under the jobs' prefixes, its own key, versions kept, destroy the user's choice."""

from __future__ import annotations

import json

from infra.resources.storage import DATA_PREFIX, RUNS_PREFIX, checkpoint_storage_path
from tests.harness.fake_aws import (
    FakeAws,
)
from tests.harness.preview_queries import TRAINING_RUN
from tests.harness.program import (
    ACCOUNT,
    Preview,
    dev_config,
    run_program,
)

POD_ROLE = "checkpoints-ray-pods"


def mocked_arn(region: str, kind: str, name: str) -> str:
    return f"arn:aws:service:{region}:{ACCOUNT}:{kind}/{name}"


def bucket_arn(plan: Preview) -> str:
    return f"arn:aws:s3:::{plan.one('aws:s3/bucket:Bucket').inputs['bucket']}"


def test_checkpoint_bucket_refuses_requests_without_tls(stack_plan):
    _, plan = stack_plan
    bucket = plan.one("aws:s3/bucket:Bucket")
    policy = plan.one("aws:s3/bucketPolicy:BucketPolicy")
    assert policy.inputs["bucket"] == f"{bucket.name}-id"
    statement = json.loads(policy.inputs["policy"])["Statement"][0]
    arn = bucket_arn(plan)
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*" and statement["Action"] == "s3:*"
    assert statement["Resource"] == [arn, f"{arn}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    public_access = plan.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").urn
    assert public_access in policy.dependencies


def test_the_pods_role_reaches_the_bucket_only_through_the_vpcs_s3_endpoint(stack_plan):
    config, plan = stack_plan
    region = config["aws:region"]
    endpoint = plan.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["serviceName"] == f"com.amazonaws.{region}.s3"
    assert "policy" not in endpoint.inputs  # the nodes' ECR pulls read their layers from S3 through it
    private_routes = [r for r in plan.of_type("aws:ec2/routeTable:RouteTable") if r.name.endswith("-private")]
    assert endpoint.inputs["routeTableIds"] == [f"{r.name}-id" for r in private_routes]
    assert endpoint.inputs["vpcId"] == f"{plan.one('aws:ec2/vpc:Vpc').name}-id"
    [_, deny] = json.loads(plan.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])["Statement"]
    arn = bucket_arn(plan)
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert deny["Resource"] == [arn, f"{arn}/*"]
    assert deny["Condition"] == {
        "ArnEquals": {"aws:PrincipalArn": mocked_arn(region, "role", POD_ROLE)},
        "StringNotEquals": {"aws:SourceVpce": f"{endpoint.name}-id"},
    }


def test_the_pods_role_reads_and_writes_the_runs_and_reads_the_corpora_only(stack_plan):
    config, plan = stack_plan
    region, arn = config["aws:region"], bucket_arn(plan)
    assert checkpoint_storage_path("b") == f"s3://b/{RUNS_PREFIX}"
    statements = {
        s["Sid"]: s
        for s in json.loads(plan.one("aws:iam/rolePolicy:RolePolicy", POD_ROLE).inputs["policy"])["Statement"]
    }
    assert all(s["Effect"] == "Allow" for s in statements.values())
    listing = statements["ListTheJobsPrefixes"]
    assert listing["Action"] == "s3:ListBucket" and listing["Resource"] == arn
    assert listing["Condition"] == {"StringLikeIfExists": {"s3:prefix": ["runs", "runs/*", "data", "data/*"]}}
    assert statements["FindTheBucket"]["Action"] == "s3:GetBucketLocation"
    runs = statements["ReadAndWriteTheRuns"]
    assert runs["Resource"] == [f"{arn}/{RUNS_PREFIX}", f"{arn}/{RUNS_PREFIX}/*"]
    assert set(runs["Action"]) == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    }
    corpora = statements["ReadTheCorpora"]
    assert corpora["Action"] == "s3:GetObject"
    assert corpora["Resource"] == [f"{arn}/{DATA_PREFIX}", f"{arn}/{DATA_PREFIX}/*"]
    key = statements["UseTheBucketKeyThroughS3"]
    assert key["Resource"] == mocked_arn(region, "key", "checkpoints")
    assert key["Action"] == ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"]
    assert key["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}
    assert set(statements) == {
        "ListTheJobsPrefixes",
        "FindTheBucket",
        "ReadAndWriteTheRuns",
        "ReadTheCorpora",
        "UseTheBucketKeyThroughS3",
    }


def test_the_bucket_is_encrypted_with_a_key_of_its_own_that_the_pods_use_through_s3(stack_plan):
    config, plan = stack_plan
    region = config["aws:region"]
    key = plan.one("aws:kms/key:Key", "checkpoints")
    assert key.inputs["enableKeyRotation"] is True and key.inputs["deletionWindowInDays"] == 30
    root, pods = json.loads(key.inputs["policy"])["Statement"]
    assert root["Principal"] == {"AWS": f"arn:aws:iam::{ACCOUNT}:root"} and root["Action"] == "kms:*"
    assert pods["Effect"] == "Allow" and pods["Principal"] == {"AWS": mocked_arn(region, "role", POD_ROLE)}
    assert pods["Action"] == ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"]
    assert pods["Condition"] == {"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}
    assert plan.one("aws:iam/role:Role", POD_ROLE).urn in key.dependencies
    [rule] = plan.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "aws:kms",
        "kmsMasterKeyId": mocked_arn(region, "key", "checkpoints"),
    }
    assert rule["bucketKeyEnabled"] is True


def test_the_training_run_waits_for_the_pods_rights_and_the_buckets_guards(stack_plan):
    _, plan = stack_plan
    run = plan.one(TRAINING_RUN)
    for type_token in (
        "aws:iam/rolePolicy:RolePolicy",
        "aws:s3/bucketPolicy:BucketPolicy",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    ):
        ready = plan.one(type_token, POD_ROLE if type_token.endswith("RolePolicy") else "checkpoints")
        assert ready.urn in run.dependencies, type_token


def test_checkpoint_bucket_keeps_versions_and_survives_destroy_unless_asked(stack_plan):
    _, plan = stack_plan
    bucket = plan.one("aws:s3/bucket:Bucket")
    assert bucket.inputs["forceDestroy"] is False
    versioning = plan.one("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["bucket"] == f"{bucket.name}-id"
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}
    lifecycle = plan.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    [rule] = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled" and rule["filter"] == {"prefix": ""}
    assert rule["noncurrentVersionExpiration"] == {"noncurrentDays": 30}
    assert rule["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
    assert versioning.urn in lifecycle.dependencies


def test_force_destroy_is_the_users_choice():
    plan = run_program(dev_config(checkpointsForceDestroy="true"), FakeAws(region="us-east-2"))
    assert plan.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is True
