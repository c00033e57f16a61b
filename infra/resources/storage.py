"""Checkpoint storage: a private S3 bucket, encrypted with a key of its own, that only the Ray pods
can reach (IRSA), only from inside the VPC, and only under the prefixes the jobs use.

Ray Train needs storage every worker node can reach for checkpoints; the node role gets no S3
access, the pods' service account assumes a role scoped to this one bucket. The pods reach S3
through a gateway endpoint on the private route tables, and the bucket refuses the pods' role any
request that comes another way: its credentials, taken out of a pod, open nothing from elsewhere.

A `pulumi destroy` that keeps the bucket (`forceDestroy` false, checkpoints in it) keeps it guarded
and readable: its policy and configuration go with the bucket or not at all, and its key outlives it
(`CheckpointStore`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config.training_settings import NO_JOB_URIS, JobUris
from infra.resources.irsa import irsa_role
from infra.resources.keys import account_statement, customer_key
from platform_contract import RAY_SERVICE_ACCOUNT

BUCKET_NAME_LIMIT = 63
# Overwritten or deleted checkpoints stay recoverable this long; uploads cut short are cleaned up.
NONCURRENT_VERSION_DAYS = 30
INCOMPLETE_UPLOAD_DAYS = 7
# Where the job keeps its runs (its --storage-path): checkpoints, TensorBoard, the corpus cache. The
# pods read and write there.
RUNS_PREFIX = "runs"
# Where corpora go (`training.data`, `training.evalData`): the pods read there, and write nowhere.
DATA_PREFIX = "data"
# What the pods' role may do with the bucket's key, through S3 only (S3 user guide, "Using
# server-side encryption with AWS KMS keys": GenerateDataKey to write, Decrypt to read and to
# complete a multipart upload).
BUCKET_KEY_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"]


def checkpoint_storage_path(bucket_name: str) -> str:
    """Where the training job keeps its runs: `--storage-path` of the job."""
    return f"s3://{bucket_name}/{RUNS_PREFIX}"


def granted_prefixes(bucket_name: str) -> list[str]:
    """The bucket's prefixes the pods' role holds rights on whatever the job names: the runs, the corpora."""
    return [checkpoint_storage_path(bucket_name), f"s3://{bucket_name}/{DATA_PREFIX}"]


def s3_endpoint_service(region: str) -> str:
    """The S3 gateway endpoint's service name (VPC user guide, "Gateway endpoints for Amazon S3")."""
    return f"com.amazonaws.{region}.s3"


def s3_via_service(region: str) -> str:
    """S3 as KMS names the service that calls it for a requester (`kms:ViaService`)."""
    return f"s3.{region}.amazonaws.com"


def checkpoint_bucket_name(cluster_name: str, region: str) -> str:
    """A name known at preview, unique per account, region and cluster (S3 names are global).

    Knowing it before anything exists lets the training job's arguments, which carry the
    storage path, be computed and validated during `pulumi preview`.
    """
    account = aws.get_caller_identity().account_id
    suffix = f"-{account}-{region}-ckpt"
    return f"{cluster_name.lower().replace('_', '-')[: BUCKET_NAME_LIMIT - len(suffix)]}{suffix}"


def prefix_objects(bucket_arn: str, prefix: str) -> list[str]:
    """The objects under `prefix`, and the key `prefix` itself (pyarrow asks S3 for it, HeadObject,
    when Ray looks up the folder)."""
    return [f"{bucket_arn}/{prefix}", f"{bucket_arn}/{prefix}/*"]


def _bucket_and_prefix(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.rstrip("/")


def job_uri_statements(uris: JobUris) -> list[dict[str, Any]]:
    """The pods' rights on the URIs the job's flags name outside the stack's own prefixes
    (`infra.config.training_settings.job_uris`), exactly: list the prefix, read its objects, and for
    the corpus cache write them too. Another bucket is not behind this stack's endpoint-only Deny
    (that is the stack's bucket's own policy); a bucket encrypted under a KMS key of its own needs
    that key's owner to let the pods' role decrypt. None without such a URI."""
    statements: list[dict[str, Any]] = []
    for kind, listed, actions in (
        ("Read", uris.read, ["s3:GetObject"]),
        (
            "ReadAndWrite",
            uris.write,
            ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
        ),
    ):
        for index, uri in enumerate(listed):
            bucket, prefix = _bucket_and_prefix(uri)
            bucket_arn = f"arn:aws:s3:::{bucket}"
            objects = prefix_objects(bucket_arn, prefix) if prefix else [f"{bucket_arn}/*"]
            listing = [prefix, f"{prefix}/*"] if prefix else ["*"]
            statements += [
                {
                    "Sid": f"List{kind}JobUri{index}",
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                    "Resource": bucket_arn,
                    "Condition": {"StringLikeIfExists": {"s3:prefix": listing}},
                },
                {"Sid": f"{kind}JobUri{index}", "Effect": "Allow", "Action": actions, "Resource": objects},
            ]
    return statements


def bucket_access_policy(bucket_arn: str, key_arn: str, region: str, uris: JobUris = NO_JOB_URIS) -> str:
    """Read and write the runs, read the corpora, use the bucket's key through S3; and the URIs the
    job names elsewhere (`job_uri_statements`); nothing else.

    Listing is held to the two prefixes with `StringLikeIfExists`: a request that names no prefix
    (HeadBucket, which pyarrow sends before it makes a folder, as Ray Train does for each run) needs
    `s3:ListBucket` too, and `StringLike` would refuse it; with the permission S3 also answers 404,
    not 403, for a missing key, which pyarrow needs to tell a new path from a refused one.
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListTheJobsPrefixes",
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": bucket_arn,
                    "Condition": {
                        "StringLikeIfExists": {
                            "s3:prefix": [
                                form
                                for prefix in (RUNS_PREFIX, DATA_PREFIX)
                                for form in (prefix, f"{prefix}/*")
                            ]
                        }
                    },
                },
                {
                    "Sid": "FindTheBucket",
                    "Effect": "Allow",
                    "Action": "s3:GetBucketLocation",
                    "Resource": bucket_arn,
                },
                {
                    "Sid": "ReadAndWriteTheRuns",
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                    "Resource": prefix_objects(bucket_arn, RUNS_PREFIX),
                },
                {
                    "Sid": "ReadTheCorpora",
                    "Effect": "Allow",
                    "Action": "s3:GetObject",
                    "Resource": prefix_objects(bucket_arn, DATA_PREFIX),
                },
                {
                    "Sid": "UseTheBucketKeyThroughS3",
                    "Effect": "Allow",
                    "Action": BUCKET_KEY_ACTIONS,
                    "Resource": key_arn,
                    "Condition": {"StringEquals": {"kms:ViaService": s3_via_service(region)}},
                },
                *job_uri_statements(uris),
            ],
        }
    )


def bucket_key_policy(account_id: str, pods_role_arn: str, region: str) -> str:
    """The bucket key's policy: the account manages it; the Ray pods' role may use it through S3 alone."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                account_statement(account_id),
                {
                    "Sid": "RayPodsThroughS3",
                    "Effect": "Allow",
                    "Principal": {"AWS": pods_role_arn},
                    "Action": BUCKET_KEY_ACTIONS,
                    "Resource": "*",
                    "Condition": {"StringEquals": {"kms:ViaService": s3_via_service(region)}},
                },
            ],
        }
    )


def bucket_policy(bucket_arn: str, pods_role_arn: str, endpoint_id: str) -> str:
    """Deny every request without TLS, and every request of the Ray pods' role that does not come
    through the VPC's S3 endpoint.

    The S3 user guide's forms: `aws:SecureTransport` is "false" on plain HTTP requests ("Enforce
    encryption in transit"); `aws:SourceVpce` names the endpoint a request came through, and is
    absent on one that came through none, which `StringNotEquals` denies too ("Controlling access
    from VPC endpoints with bucket policies"). `aws:PrincipalArn` is the role's ARN for every
    session of it, so people and the deployer keep their access from anywhere.
    """
    everything = [bucket_arn, f"{bucket_arn}/*"]
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyRequestsWithoutTls",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": everything,
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                },
                {
                    "Sid": "RayPodsOnlyThroughTheVpcEndpoint",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": everything,
                    "Condition": {
                        "ArnEquals": {"aws:PrincipalArn": pods_role_arn},
                        "StringNotEquals": {"aws:SourceVpce": endpoint_id},
                    },
                },
            ],
        }
    )


class CheckpointStore(pulumi.ComponentResource):
    """The bucket, its key and guards, the VPC's S3 endpoint, and the role the Ray pods' service
    account assumes."""

    def __init__(
        self,
        name: str,
        *,
        bucket_name: str,
        region: str,
        namespace: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        vpc_id: pulumi.Input[str],
        route_table_ids: Sequence[pulumi.Input[str]],
        force_destroy: bool,
        job_uris: JobUris = NO_JOB_URIS,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`job_uris`: what the job's flags name outside the bucket's prefixes, granted exactly.
        `force_destroy`: `pulumi destroy` deletes every object version with the bucket, and its
        key; otherwise it stops at a bucket that still holds checkpoints, so none is lost by accident,
        and leaves the bucket its guards and the key enabled (the key out of the state).
        `route_table_ids`: the private subnets' route tables (`Network.private_route_table_ids`),
        which the S3 endpoint joins."""
        super().__init__("eks-ray-train:infra:CheckpointStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = irsa_role(
            f"{name}-ray-pods",
            oidc_provider_arn=oidc_provider_arn,
            oidc_provider_url=oidc_provider_url,
            namespace=namespace,
            service_account=RAY_SERVICE_ACCOUNT,
            opts=child,
        )
        # After the role, which its policy names (KMS refuses a principal that does not exist).
        # Kept when the bucket is: a destroy with force_destroy false drops the key from the state
        # and leaves it enabled, so the checkpoints it encrypts stay readable (KMS refuses to decrypt
        # with a key pending deletion, and deletes it 30 days later). Not ordered after the bucket
        # instead (the bucket depending on the key): the key depends on the pods' role, the role on
        # the cluster's OIDC provider, so the bucket's delete would come before the control plane's,
        # the VPC's and the NAT gateway's, and a destroy stopped at a kept bucket would leave them
        # all running. With force_destroy the key goes, with every checkpoint.
        account_id = aws.get_caller_identity().account_id
        self.key = customer_key(
            name,
            description=f"Server-side encryption of the checkpoint bucket {bucket_name}",
            policy=self.role.arn.apply(lambda role_arn: bucket_key_policy(account_id, role_arn, region)),
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=not force_destroy),
        )
        # S3 traffic of the private subnets stays in AWS's network, and carries the endpoint's id,
        # which the bucket policy requires of the pods' role. No endpoint policy: the nodes' image
        # pulls from ECR read their layers from S3 through it too.
        self.endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc_id,
            service_name=s3_endpoint_service(region),
            vpc_endpoint_type="Gateway",
            route_table_ids=list(route_table_ids),
            tags={"Name": f"{name}-s3"},
            opts=child,
        )
        self.bucket = aws.s3.Bucket(name, bucket=bucket_name, force_destroy=force_destroy, opts=child)
        # The bucket's guards (its policy, public access block, encryption, ownership, versioning and
        # lifecycle) go with the bucket or not at all: S3 deletes a bucket's policy and configuration
        # with the bucket, so Pulumi skips their own deletes when it deletes the bucket in the same
        # run (`deleted_with`), and a destroy that stops at a bucket still holding checkpoints leaves
        # them on it rather than removing each before it tries the bucket. Not `retain_on_delete`,
        # which skips the delete always: a guard taken out of the program, or replaced on its own,
        # would stay on the bucket with no state to show it. Either way a skipped guard leaves the
        # state in that destroy; the next `pulumi up` records it again (its create is the same S3
        # Put call as its update).
        guard = pulumi.ResourceOptions(parent=self, deleted_with=self.bucket)
        versioning = aws.s3.BucketVersioning(
            name, bucket=self.bucket.id, versioning_configuration={"status": "Enabled"}, opts=guard
        )
        # Its rules are about noncurrent versions, so it follows versioning.
        aws.s3.BucketLifecycleConfiguration(
            name,
            bucket=self.bucket.id,
            rules=[
                {
                    "id": "expire-old-versions-and-abandoned-uploads",
                    "status": "Enabled",
                    "filter": {"prefix": ""},
                    "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_VERSION_DAYS},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": INCOMPLETE_UPLOAD_DAYS},
                }
            ],
            opts=pulumi.ResourceOptions.merge(guard, pulumi.ResourceOptions(depends_on=[versioning])),
        )
        public_access = aws.s3.BucketPublicAccessBlock(
            name,
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=guard,
        )
        # New objects under the bucket's own key; a bucket key makes S3 ask KMS for a data key per
        # bucket and period rather than per object.
        encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            name,
            bucket=self.bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {
                        "sse_algorithm": "aws:kms",
                        "kms_master_key_id": self.key.arn,
                    },
                    "bucket_key_enabled": True,
                }
            ],
            opts=guard,
        )
        # After the public access block: S3 judges a new policy against the block in force.
        guards = aws.s3.BucketPolicy(
            name,
            bucket=self.bucket.id,
            policy=pulumi.Output.all(self.bucket.arn, self.role.arn, self.endpoint.id).apply(
                lambda args: bucket_policy(*args)
            ),
            opts=pulumi.ResourceOptions.merge(guard, pulumi.ResourceOptions(depends_on=[public_access])),
        )
        aws.s3.BucketOwnershipControls(
            name, bucket=self.bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=guard
        )
        access = aws.iam.RolePolicy(
            f"{name}-ray-pods",
            role=self.role.id,
            policy=pulumi.Output.all(self.bucket.arn, self.key.arn).apply(
                lambda args: bucket_access_policy(args[0], args[1], region, job_uris)
            ),
            opts=child,
        )
        self.storage_path = checkpoint_storage_path(bucket_name)
        # What a job that writes checkpoints waits for: the pods' rights, the key, the bucket's guards.
        self.ready: list[pulumi.Resource] = [access, encryption, guards]
        self.register_outputs(
            {"bucket": self.bucket.bucket, "roleArn": self.role.arn, "endpointId": self.endpoint.id}
        )
