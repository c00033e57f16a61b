"""The checkpoint bucket in the program's plan: TLS only, the pods' role only through the VPC's S3
endpoint and only under the jobs' prefixes, its own key, versions kept, destroy the user's choice;
a destroy that keeps the bucket keeps it guarded and readable."""

from __future__ import annotations

import dataclasses
import graphlib
import json

import pytest

from infra.resources.storage import DATA_PREFIX, RUNS_PREFIX, checkpoint_storage_path
from tests.harness.fake_aws import (
    FakeAws,
)
from tests.harness.preview_queries import TRAINING_RUN
from tests.harness.program import (
    ACCOUNT,
    Preview,
    Registration,
    destroy_outcome,
    dev_config,
    run_program,
)

BUCKET = "aws:s3/bucket:Bucket"
KEY = "aws:kms/key:Key"
# What guards the bucket and its objects, each a configuration of the bucket that S3 deletes with it.
GUARDS = [
    "aws:s3/bucketPolicy:BucketPolicy",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
]

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


def in_aws(plan: Preview, urn: str) -> bool:
    """Whether the resource is something in AWS or the cluster (not a component, not a provider)."""
    registration = plan.by_urn(urn)
    return registration.custom and not registration.type.startswith("pulumi:providers:")


@pytest.mark.parametrize("continue_on_error", [False, True], ids=["destroy", "destroy --continue-on-error"])
def test_a_destroy_that_stops_at_the_kept_bucket_leaves_it_guarded_and_readable(
    stack_plan, continue_on_error
):
    """forceDestroy false, checkpoints in the bucket: its delete fails (BucketNotEmpty). No guard and
    not the key is deleted before, or after; everything else the stack has in AWS is."""
    config, plan = stack_plan
    bucket = plan.one(BUCKET)
    guards = [plan.one(type_token, "checkpoints") for type_token in GUARDS]
    key = plan.one(KEY, "checkpoints")
    assert [guard.deleted_with for guard in guards] == [bucket.urn] * len(GUARDS)
    assert key.retain_on_delete and not bucket.retain_on_delete and not bucket.deleted_with
    outcome = plan.destroy(failing=bucket.urn, continue_on_error=continue_on_error)
    assert outcome.failed == {bucket.urn}
    kept = {guard.urn for guard in guards} | {key.urn}
    assert not kept & outcome.deleted
    assert kept <= outcome.dropped  # out of the state, in AWS: the next `pulumi up` records them again
    # The bucket holds nothing else back: the control plane, the nodes, the network and the cluster's
    # key go as in any destroy.
    assert [plan.by_urn(urn).type for urn in outcome.standing if in_aws(plan, urn)] == []
    cluster_key = plan.one(KEY, f"{config['eks-ray-train:clusterName']}-secrets")
    nat = plan.one("aws:ec2/natGateway:NatGateway")
    assert {cluster_key.urn, nat.urn} <= outcome.deleted
    assert plan.one("eks:index:Cluster").urn not in outcome.standing


def test_force_destroy_deletes_the_bucket_its_guards_and_its_key():
    plan = run_program(dev_config(checkpointsForceDestroy="true"), FakeAws(region="us-east-2"))
    bucket, key = plan.one(BUCKET), plan.one(KEY, "checkpoints")
    assert not key.retain_on_delete
    outcome = plan.destroy()
    assert {bucket.urn, key.urn} <= outcome.deleted
    # S3 deletes a bucket's configuration with the bucket: no call of its own.
    assert {plan.one(type_token, "checkpoints").urn for type_token in GUARDS} <= outcome.dropped
    assert outcome.standing == outcome.failed == frozenset()


def in_registration_order(resources: list[Registration]) -> list[Registration]:
    """The resources in an order the SDK could register them: each after its parent and dependencies."""
    by_urn = {r.urn: r for r in resources}
    graph = {
        r.urn: {u for u in (r.parent, r.deleted_with, *r.dependencies) if u in by_urn} for r in resources
    }
    return [by_urn[urn] for urn in graphlib.TopologicalSorter(graph).static_order()]


def test_a_bucket_ordered_after_its_key_would_keep_the_cluster_running(stack_plan):
    """Why the key is retained rather than deleted after the bucket: the key depends on the pods'
    role, the role on the cluster's OIDC provider, so a bucket depending on the key is deleted before
    the control plane and the network, and a destroy that stops at it leaves them running."""
    _, plan = stack_plan
    bucket, key = plan.one(BUCKET), plan.one(KEY, "checkpoints")
    after_key = dataclasses.replace(bucket, dependencies=[*bucket.dependencies, key.urn])
    resources = in_registration_order([after_key if r.urn == bucket.urn else r for r in plan.resources])
    standing = destroy_outcome(resources, failing=bucket.urn).standing
    kept_running = {plan.by_urn(urn).type for urn in standing if in_aws(plan, urn)}
    assert {"aws:ec2/natGateway:NatGateway", "aws:ec2/vpc:Vpc", "aws:iam/role:Role", KEY} <= kept_running
    assert plan.one("eks:index:Cluster").urn in standing


def registration(name: str, *depends_on: str, **options) -> Registration:
    return Registration(
        type="test:index:Thing",
        name=name,
        urn=name,
        parent="",
        dependencies=list(depends_on),
        inputs={},
        secret_inputs=set(),
        **options,
    )


def test_the_destroy_model_follows_the_engines_schedule():
    """Dependents first, a wave at a time; no Delete for the retained or for what goes with a resource
    being deleted; a failed delete stops after its wave, or, with --continue-on-error, holds back only
    what it depends on."""
    resources = [
        registration("network"),
        registration("key", retain_on_delete=True),
        registration("store"),
        registration("bucket", "store"),
        registration("policy", "bucket", deleted_with="bucket"),
        registration("role", "network"),
        registration("nodes", "role"),
        registration("uses-key", "key", "bucket"),
    ]
    # Waves: {nodes, policy, uses-key}, {role, bucket}, {network, key, store}.
    stopped = destroy_outcome(resources, failing="bucket")
    assert stopped.deleted == {"nodes", "uses-key", "role"} and stopped.dropped == {"policy"}
    assert stopped.failed == {"bucket"} and stopped.standing == {"network", "key", "store"}
    going_on = destroy_outcome(resources, failing="bucket", continue_on_error=True)
    assert going_on.deleted == {"nodes", "uses-key", "role", "network"}
    assert going_on.dropped == {"policy", "key"} and going_on.standing == {"store"}
    everything = destroy_outcome(resources)
    assert everything.deleted == {"nodes", "uses-key", "role", "network", "bucket", "store"}
    assert everything.dropped == {"policy", "key"} and not everything.standing


def test_a_corpus_in_another_bucket_is_granted_exactly_and_nothing_else_is_added():
    """`training.data` and `corpusCache` anywhere in S3: the pods' role reads exactly the corpus's
    prefix and reads and writes exactly the cache's; a URI under the stack's own prefixes adds nothing
    (the standing grants cover it). The stack's endpoint-only Deny stays on its own bucket."""
    bucket = "eks-ray-train-123456789012-us-east-2-ckpt"
    training = json.dumps(
        {
            "data": "s3://other-bucket/text/",
            "corpusCache": "s3://cache-bucket/packed",
            "evalData": f"s3://{bucket}/data/held-out.jsonl",
        }
    )
    plan = run_program(dev_config(training=training), FakeAws(region="us-east-2"))
    policy = json.loads(plan.one("aws:iam/rolePolicy:RolePolicy", POD_ROLE).inputs["policy"])
    statements = {s["Sid"]: s for s in policy["Statement"]}
    added = {sid: s for sid, s in statements.items() if "JobUri" in sid}
    assert added == {
        "ListReadJobUri0": {
            "Sid": "ListReadJobUri0",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": "arn:aws:s3:::other-bucket",
            "Condition": {"StringLikeIfExists": {"s3:prefix": ["text", "text/*"]}},
        },
        "ReadJobUri0": {
            "Sid": "ReadJobUri0",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::other-bucket/text", "arn:aws:s3:::other-bucket/text/*"],
        },
        "ListReadAndWriteJobUri0": {
            "Sid": "ListReadAndWriteJobUri0",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": "arn:aws:s3:::cache-bucket",
            "Condition": {"StringLikeIfExists": {"s3:prefix": ["packed", "packed/*"]}},
        },
        "ReadAndWriteJobUri0": {
            "Sid": "ReadAndWriteJobUri0",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            "Resource": ["arn:aws:s3:::cache-bucket/packed", "arn:aws:s3:::cache-bucket/packed/*"],
        },
    }
    deny = json.loads(plan.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    assert "other-bucket" not in json.dumps(deny) and "cache-bucket" not in json.dumps(deny)
