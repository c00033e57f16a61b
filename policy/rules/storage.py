"""Buckets and logs: TLS-only and versioned buckets, log groups with a retention and a KMS key."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    AWS_EKS_CLUSTER,
    BUCKET_POLICY,
    BUCKET_VERSIONING,
    BUCKETS,
    LOG_GROUP,
    PULUMI_EKS_CLUSTER,
    StackResource,
    dig,
    is_false,
    is_true,
    is_unknown,
    items,
    linked,
)
from .registry import ADVISORY, MANDATORY, resource_rule, stack_rule


def control_plane_log_group(cluster_name: str) -> str:
    """Where EKS sends a cluster's control-plane logs; EKS creates it, without retention, if it is missing."""
    return f"/aws/eks/{cluster_name}/cluster"


def denies_plain_http(policy: Any) -> bool | None:
    """Whether a bucket policy denies every S3 action on the bucket and its objects without TLS; None if unknown.

    The S3 user guide's form: Deny, any principal, `s3:*`, the bucket and `bucket/*`, when
    `aws:SecureTransport` is "false".
    """
    if is_unknown(policy):
        return None
    try:
        document = json.loads(policy) if isinstance(policy, str) else policy
    except ValueError:
        return False
    statements = dig(document, "Statement")
    for statement in [statements] if isinstance(statements, Mapping) else items(statements):
        actions = dig(statement, "Action")
        resources = dig(statement, "Resource")
        resources = [resources] if isinstance(resources, str) else items(resources)
        principal = dig(statement, "Principal")
        secure = dig(statement, "Condition", "Bool", "aws:SecureTransport")
        if (
            dig(statement, "Effect") == "Deny"
            and principal in ("*", {"AWS": "*"})
            and {"s3:*", "*"} & set([actions] if isinstance(actions, str) else items(actions))
            and any(str(r).endswith("/*") for r in resources)
            and any(not str(r).endswith("/*") for r in resources)
            and (is_false(secure) or items(secure) in (["false"], [False]))
        ):
            return True
    return False


@stack_rule(
    "s3-buckets-tls-only",
    MANDATORY,
    description="Every S3 bucket has a policy denying requests without TLS (aws:SecureTransport false).",
    resources="S3 buckets and their bucket policies",
    requires="a bucket policy with a statement that denies `s3:*` on the bucket and `bucket/*` to any principal when `aws:SecureTransport` is `false`",
)
def buckets_tls_only(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every bucket has a policy that refuses requests without TLS (`aws:SecureTransport` false)."""
    policies = [r for r in resources if r.type == BUCKET_POLICY]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        verdicts = [
            denies_plain_http(p.props.get("policy")) for p in linked(bucket, "bucket", policies, "bucket")
        ]
        if True in verdicts or None in verdicts:
            continue
        problem = (
            "has no bucket policy" if not verdicts else "has a bucket policy that does not deny plain HTTP"
        )
        violations.append(
            (
                bucket.urn,
                f"the bucket {problem}: add a statement denying s3:* on the bucket and bucket/* when "
                "aws:SecureTransport is false",
            )
        )
    return violations


@stack_rule(
    "s3-buckets-versioned",
    MANDATORY,
    description="Every S3 bucket keeps object versions.",
    resources="S3 buckets and their versioning configurations",
    requires="every bucket has versioning `Enabled`",
)
def buckets_versioned(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every bucket keeps object versions, so an overwritten or deleted object can be recovered."""
    configs = [r for r in resources if r.type in BUCKET_VERSIONING]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        statuses = [
            dig(c.props, "versioningConfiguration", "status")
            for c in linked(bucket, "bucket", configs, "bucket")
        ]
        if is_true(dig(bucket.props, "versioning", "enabled")):
            continue
        if "Enabled" in statuses or any(is_unknown(status) for status in statuses):
            continue
        violations.append(
            (bucket.urn, "the bucket does not keep versions: add a BucketVersioning with status Enabled")
        )
    return violations


@stack_rule(
    "log-retention-set",
    MANDATORY,
    description="Every CloudWatch log group, the EKS control plane's included, has a retention.",
    resources="CloudWatch log groups and EKS clusters",
    requires="every log group sets `retentionInDays`; a cluster with control-plane logs on has its `/aws/eks/<cluster>/cluster` group in the stack (else EKS creates it with no retention)",
)
def log_retention(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Logs do not pile up forever: every log group has a retention, including the EKS control plane's.

    EKS writes control-plane logs to `/aws/eks/<cluster>/cluster` and creates that group, with no
    retention, when the stack does not; so a cluster with logs on needs the group in the stack.
    """
    violations = []
    groups = [r for r in resources if r.type == LOG_GROUP]
    for group in groups:
        retention = group.props.get("retentionInDays")
        if retention is None or (not is_unknown(retention) and not retention):
            violations.append(
                (group.urn, "the log group has no retentionInDays, so CloudWatch keeps its logs forever")
            )
    names = {g.props.get("name") for g in groups}
    for cluster in (r for r in resources if r.type in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER)):
        name, logs = cluster.props.get("name"), cluster.props.get("enabledClusterLogTypes")
        if not isinstance(name, str) or is_unknown(name) or is_unknown(logs) or not items(logs):
            continue
        if control_plane_log_group(name) not in names and not any(is_unknown(n) for n in names):
            violations.append(
                (
                    cluster.urn,
                    f"control-plane logs go to {control_plane_log_group(name)}, which is not in the stack: EKS "
                    "would create it without retention; create it with retentionInDays before the cluster",
                )
            )
    return violations


@resource_rule(
    "log-groups-kms-encrypted",
    ADVISORY,
    description="CloudWatch log groups are encrypted with a customer-managed KMS key.",
    resources="CloudWatch log groups",
    requires="`kmsKeyId` set",
)
def log_groups_kms_encrypted(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Log groups are encrypted with a customer-managed KMS key, so reading them needs that key too."""
    if resource_type != LOG_GROUP:
        return []
    key = props.get("kmsKeyId")
    if is_unknown(key) or (isinstance(key, str) and key):
        return []
    return ["the log group has no kmsKeyId: encrypt it with a KMS key whose policy admits CloudWatch Logs"]
