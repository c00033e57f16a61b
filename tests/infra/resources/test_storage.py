"""The checkpoint bucket in the program's plan: TLS only, versions kept, destroy the user's choice."""

from __future__ import annotations

import json

from tests.harness.fake_aws import (
    FakeAws,
)
from tests.harness.program import (
    dev_config,
    run_program,
)


def test_checkpoint_bucket_refuses_requests_without_tls(stack_plan):
    _, plan = stack_plan
    bucket = plan.one("aws:s3/bucket:Bucket")
    policy = plan.one("aws:s3/bucketPolicy:BucketPolicy")
    assert policy.inputs["bucket"] == f"{bucket.name}-id"
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    arn = f"arn:aws:s3:::{bucket.inputs['bucket']}"
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*" and statement["Action"] == "s3:*"
    assert statement["Resource"] == [arn, f"{arn}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    public_access = plan.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").urn
    assert public_access in policy.dependencies


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
