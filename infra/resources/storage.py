"""Checkpoint storage: a private, encrypted S3 bucket that only the Ray pods can reach (IRSA).

Ray Train needs storage every worker node can reach for checkpoints; the node role gets no S3
access, the pods' service account assumes a role scoped to this one bucket.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from platform_contract import RAY_SERVICE_ACCOUNT

BUCKET_NAME_LIMIT = 63
# Overwritten or deleted checkpoints stay recoverable this long; uploads cut short are cleaned up.
NONCURRENT_VERSION_DAYS = 30
INCOMPLETE_UPLOAD_DAYS = 7


def checkpoint_storage_path(bucket_name: str) -> str:
    """Where the training job keeps its runs: `--storage-path` of the job."""
    return f"s3://{bucket_name}/runs"


def checkpoint_bucket_name(cluster_name: str, region: str) -> str:
    """A name known at preview, unique per account, region and cluster (S3 names are global).

    Knowing it before anything exists lets the training job's arguments, which carry the
    storage path, be computed and validated during `pulumi preview`.
    """
    account = aws.get_caller_identity().account_id
    suffix = f"-{account}-{region}-ckpt"
    return f"{cluster_name.lower().replace('_', '-')[: BUCKET_NAME_LIMIT - len(suffix)]}{suffix}"


def irsa_trust_policy(
    oidc_provider_arn: str, oidc_provider_url: str, namespace: str, service_account: str
) -> str:
    """Trust the cluster's OIDC provider, for one service account only."""
    issuer = oidc_provider_url.removeprefix("https://")
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Federated": oidc_provider_arn},
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Condition": {
                        "StringEquals": {
                            f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                            f"{issuer}:aud": "sts.amazonaws.com",
                        }
                    },
                }
            ],
        }
    )


def bucket_access_policy(bucket_arn: str) -> str:
    """Read, write and list checkpoints in this bucket, nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                    "Resource": bucket_arn,
                },
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                    "Resource": f"{bucket_arn}/*",
                },
            ],
        }
    )


def tls_only_policy(bucket_arn: str) -> str:
    """Deny every request to the bucket and its objects that does not come over TLS.

    The S3 user guide's recommended form: `aws:SecureTransport` is "false" on plain HTTP requests.
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyRequestsWithoutTls",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket_arn, f"{bucket_arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


class CheckpointStore(pulumi.ComponentResource):
    """The bucket, its guards, and the role the Ray pods' service account assumes."""

    def __init__(
        self,
        name: str,
        *,
        bucket_name: str,
        namespace: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        force_destroy: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`force_destroy`: `pulumi destroy` deletes every object version with the bucket; otherwise
        it stops at a bucket that still holds checkpoints, so none is lost by accident."""
        super().__init__("eks-ray-train:infra:CheckpointStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(name, bucket=bucket_name, force_destroy=force_destroy, opts=child)
        versioning = aws.s3.BucketVersioning(
            name, bucket=self.bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
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
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]),
        )
        public_access = aws.s3.BucketPublicAccessBlock(
            name,
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            name,
            bucket=self.bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                    "bucket_key_enabled": True,
                }
            ],
            opts=child,
        )
        # After the public access block: S3 judges a new policy against the block in force.
        aws.s3.BucketPolicy(
            name,
            bucket=self.bucket.id,
            policy=self.bucket.arn.apply(tls_only_policy),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access]),
        )
        aws.s3.BucketOwnershipControls(
            name, bucket=self.bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        self.role = aws.iam.Role(
            f"{name}-ray-pods",
            assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_provider_url).apply(
                lambda args: irsa_trust_policy(args[0], args[1], namespace, RAY_SERVICE_ACCOUNT)
            ),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-ray-pods",
            role=self.role.id,
            policy=self.bucket.arn.apply(bucket_access_policy),
            opts=child,
        )
        self.storage_path = checkpoint_storage_path(bucket_name)
        self.register_outputs({"bucket": self.bucket.bucket, "roleArn": self.role.arn})
