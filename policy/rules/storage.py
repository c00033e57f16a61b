"""Buckets and logs: TLS-only and versioned buckets reached through the VPC's S3 endpoint and
encrypted with a key of their own, log groups with a retention and a KMS key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    AWS_EKS_CLUSTER,
    BUCKET_ENCRYPTION,
    BUCKET_POLICY,
    BUCKET_VERSIONING,
    BUCKETS,
    LOG_GROUP,
    PULUMI_EKS_CLUSTER,
    VPC_ENDPOINT,
    StackResource,
    as_list,
    dig,
    is_false,
    is_true,
    is_unknown,
    items,
    linked,
    policy_statements,
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
    statements = policy_statements(policy)
    if statements is None:
        return None
    for statement in statements:
        secure = dig(statement, "Condition", "Bool", "aws:SecureTransport")
        if denies_all_of_the_bucket(statement) and (
            is_false(secure) or items(secure) in (["false"], [False])
        ):
            return True
    return False


def denies_all_of_the_bucket(statement: Any) -> bool:
    """A statement that denies every S3 action on the bucket and its objects to any principal (its
    condition aside)."""
    resources = as_list(dig(statement, "Resource"))
    return (
        dig(statement, "Effect") == "Deny"
        and dig(statement, "Principal") in ("*", {"AWS": "*"})
        and bool({"s3:*", "*"} & set(as_list(dig(statement, "Action"))))
        and any(str(r).endswith("/*") for r in resources)
        and any(not str(r).endswith("/*") for r in resources)
    )


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


def is_s3_gateway(endpoint: StackResource) -> bool | None:
    """Whether a VPC endpoint is an S3 gateway on at least one route table; None while unknown."""
    kind, service, tables = (
        endpoint.props.get(key) for key in ("vpcEndpointType", "serviceName", "routeTableIds")
    )
    if any(is_unknown(value) for value in (kind, service, tables)):
        return None
    return kind == "Gateway" and isinstance(service, str) and service.endswith(".s3") and bool(items(tables))


def endpoints_required(policy: StackResource) -> list[Any] | None:
    """The endpoints a bucket policy requires: `aws:SourceVpce` of each statement that denies all of
    the bucket when a request came through another endpoint or none (`StringNotEquals`); None while
    the policy is unknown."""
    statements = policy_statements(policy.props.get("policy"))
    if statements is None:
        return None
    return [
        endpoint
        for statement in statements
        if denies_all_of_the_bucket(statement)
        for operator in ("StringNotEquals", "StringNotEqualsIfExists")
        for endpoint in as_list(dig(statement, "Condition", operator, "aws:SourceVpce"))
    ]


def _endpoint_verdict(policy: StackResource, gateways: Sequence[StackResource]) -> bool | str | None:
    """True when the policy requires an S3 gateway endpoint of the stack, None while unknown, else
    what is missing."""
    required = endpoints_required(policy)
    if required is None or any(is_unknown(endpoint) for endpoint in required):
        return None
    if not required:
        return "has no statement denying requests that do not come through the VPC's S3 endpoint"
    if any(g.urn in policy.dependencies or g.props.get("id") in required for g in gateways):
        return True
    return "requires an endpoint that is no S3 gateway endpoint of the stack on a route table"


@stack_rule(
    "s3-buckets-vpc-endpoint-only",
    MANDATORY,
    description="Every S3 bucket's policy denies requests that do not come through the stack's S3 gateway endpoint.",
    resources="S3 buckets, their bucket policies and the VPC endpoints",
    requires="a bucket policy statement denying `s3:*` on the bucket and `bucket/*` when `aws:SourceVpce` is not (`StringNotEquals`) an S3 gateway endpoint of the stack that joins a route table",
)
def buckets_vpc_endpoint_only(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Credentials that reach a bucket, taken out of the VPC, open nothing: the bucket policy refuses
    the principals it names (or everyone) any request that does not come through the VPC's S3 gateway
    endpoint (S3 user guide, "Controlling access from VPC endpoints with bucket policies")."""
    policies = [r for r in resources if r.type == BUCKET_POLICY]
    gateways = [r for r in resources if r.type == VPC_ENDPOINT and is_s3_gateway(r) is not False]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        verdicts = [_endpoint_verdict(p, gateways) for p in linked(bucket, "bucket", policies, "bucket")]
        if True in verdicts or None in verdicts:
            continue
        problem = next((f"'s policy {v}" for v in verdicts if isinstance(v, str)), " has no bucket policy")
        violations.append(
            (
                bucket.urn,
                f"the bucket{problem}: add an S3 gateway endpoint (vpc_endpoint_type 'Gateway', service "
                "com.amazonaws.<region>.s3) on the private route tables and a bucket policy statement denying "
                "s3:* on the bucket and bucket/* when aws:SourceVpce is not that endpoint",
            )
        )
    return violations


def _kms_key_of(rules: Any) -> Any:
    """The KMS key of the first default-encryption rule that names one (unknown stays unknown)."""
    if is_unknown(rules):
        return rules
    for rule in as_list(rules) if not isinstance(rules, Mapping) else [rules]:
        default = dig(rule, "applyServerSideEncryptionByDefault")
        if is_unknown(default):
            return default
        algorithm, key = dig(default, "sseAlgorithm"), dig(default, "kmsMasterKeyId")
        if is_unknown(algorithm) or (str(algorithm).startswith("aws:kms") and key not in (None, "")):
            return key
    return None


@stack_rule(
    "s3-buckets-kms-cmk",
    MANDATORY,
    description="Every S3 bucket encrypts new objects with a customer-managed KMS key.",
    resources="S3 buckets and their server-side encryption configurations",
    requires="default encryption `aws:kms` (or `aws:kms:dsse`) naming a `kmsMasterKeyId` other than the AWS managed key `alias/aws/s3` (S3's default encryption, SSE-S3, names none)",
)
def buckets_kms_cmk(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Reading an object takes the bucket's own key too, whose policy names who may use it; S3's
    default (SSE-S3) and the AWS managed key `aws/s3` admit whoever may read the bucket."""
    configs = [r for r in resources if r.type in BUCKET_ENCRYPTION]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        keys = [_kms_key_of(c.props.get("rules")) for c in linked(bucket, "bucket", configs, "bucket")]
        keys.append(_kms_key_of(dig(bucket.props, "serverSideEncryptionConfiguration", "rule")))
        if any(key is not None and (is_unknown(key) or "alias/aws/s3" not in str(key)) for key in keys):
            continue
        violations.append(
            (
                bucket.urn,
                "the bucket does not encrypt with a key of its own: add a BucketServerSideEncryptionConfiguration "
                "with sse_algorithm 'aws:kms' and kms_master_key_id a KMS key of the stack",
            )
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
