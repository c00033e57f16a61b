"""Buckets and logs: TLS-only and versioned buckets reached through the VPC's S3 endpoint and
encrypted with a key of their own, log groups with a retention and a KMS key."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .iam import aws_managed_policy, grants_s3_everywhere
from .properties import (
    AWS_EKS_CLUSTER,
    BUCKET_ENCRYPTION,
    BUCKET_POLICY,
    BUCKET_VERSIONING,
    BUCKETS,
    IAM_POLICY,
    LOG_GROUP,
    POLICY_ATTACHMENT,
    PULUMI_EKS_CLUSTER,
    ROLE,
    ROLE_POLICY,
    ROLE_POLICY_ATTACHMENT,
    ROLE_POLICY_ATTACHMENTS_EXCLUSIVE,
    VPC_ENDPOINT,
    StackResource,
    arn_like,
    as_list,
    dig,
    iam_glob,
    is_false,
    is_true,
    is_unknown,
    items,
    linked,
    policy_statements,
    statement_grants,
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
        answers = [
            denies_plain_http(p.props.get("policy")) for p in linked(bucket, "bucket", policies, "bucket")
        ]
        if True in answers or None in answers:
            continue
        problem = (
            "has no bucket policy" if not answers else "has a bucket policy that does not deny plain HTTP"
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


# Condition operators on `aws:PrincipalArn` that hold a Deny to the principals they name, and those
# that hold it to the others (`IfExists` alike: every request carries the key). The `Arn` and `Like`
# ones take wildcards (IAM user guide, "IAM JSON policy elements: Condition operators").
_NAMING_OPERATORS = ("ArnEquals", "ArnLike", "StringEquals", "StringLike")
_SPARING_OPERATORS = ("ArnNotEquals", "ArnNotLike", "StringNotEquals", "StringNotLike")
_ACCOUNT = re.compile(r"(\d{12})|arn:[a-z-]+:iam::(\d{12}):root")


def _known_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value and not is_unknown(value) else None


def _resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


@dataclass(frozen=True)
class Grantee:
    """A principal that an Allow of the stack grants on a bucket: a role (its ARN, or only its name
    while the ARN is unknown), or everyone (a bucket policy's Allow to `Principal: "*"`)."""

    shown: str
    arn: str | None = None
    # `role<path><name>`, an ARN's last part, while only the role's name is known.
    role_part: str | None = None
    # The role of the stack, on which a bucket policy built from the role's ARN depends.
    urn: str | None = None
    everyone: bool = False


def _role_grantee(role: StackResource) -> Grantee:
    arn, name = _known_text(role.props.get("arn")), _known_text(role.props.get("name"))
    path = _known_text(role.props.get("path")) or "/"
    shown = f"role {arn or name or _resource_name(role.urn)}"
    return Grantee(shown, arn, f"role{path}{name}" if name and not arn else None, role.urn)


def _named_role(reference: Any, what: str) -> Grantee:
    """A role outside the stack that a role policy or attachment names (`role`: the role's name)."""
    name = _known_text(reference)
    return Grantee(f"role {name}", role_part=f"role/{name}") if name else Grantee(f"the role of {what}")


def _allows_s3(statement: Any) -> bool:
    """An Allow of any S3 action: an `Action` pattern of the service `s3`, or a `NotAction` that leaves S3 in."""
    if isinstance(statement, Mapping) and "NotAction" in statement:
        return statement_grants(statement, "s3:_")
    return dig(statement, "Effect") == "Allow" and any(
        isinstance(action, str)
        and not is_unknown(action)
        and iam_glob(action.split(":", 1)[0], "s3", ignore_case=True)
        for action in as_list(dig(statement, "Action"))
    )


def _takes_in_bucket(statement: Any, bucket_arn: str | None, depends_on_bucket: bool) -> bool:
    """Whether a statement's resources take in the bucket or an object of it. While the bucket's
    ARN is unknown (first preview), a policy that depends on the bucket does, as does a wildcard."""
    wanted = [bucket_arn, f"{bucket_arn}/_"] if bucket_arn else ["arn:aws:s3:::_", "arn:aws:s3:::_/_"]
    if isinstance(statement, Mapping) and "NotResource" in statement:
        excluded = [p for p in as_list(statement["NotResource"]) if isinstance(p, str)]
        if is_unknown(statement["NotResource"]) or any(is_unknown(p) for p in excluded):
            return False
        return not all(any(iam_glob(p, arn) for p in excluded) for arn in wanted)
    patterns = [p for p in as_list(dig(statement, "Resource")) if isinstance(p, str) and not is_unknown(p)]
    if not bucket_arn and depends_on_bucket:
        return True
    # An object pattern names the bucket by what precedes its first `/`.
    return any(iam_glob(p, wanted[0]) or iam_glob(p.split("/", 1)[0], wanted[0]) for p in patterns)


def _grants_on(document: Any, bucket_arn: str | None, depends_on_bucket: bool) -> bool:
    """Whether a policy document allows S3 on the bucket (an unknown document: not that the pack can tell)."""
    return any(
        _allows_s3(statement) and _takes_in_bucket(statement, bucket_arn, depends_on_bucket)
        for statement in policy_statements(document) or []
    )


def _holders(
    resource: StackResource, references: Sequence[Any], roles: Sequence[StackResource], what: str
) -> list[Grantee]:
    """The roles a role policy or attachment gives its rights, one for each role it names: the
    stack's role of that name (or id); else, while the name is unknown, the roles of the stack it
    depends on whose names are unknown too (a first preview); else the role outside the stack it names."""
    held: list[Grantee] = []
    for reference in references:
        name = _known_text(reference)
        named = [r for r in roles if name and name in (r.props.get("name"), r.props.get("id"))] or [
            r
            for r in roles
            if r.urn in resource.dependencies and not any(_known_text(r.props.get(k)) for k in ("name", "id"))
        ]
        held += [_role_grantee(role) for role in named] or [_named_role(name, what)]
    return held


def _attachments(resources: Sequence[StackResource]) -> list[tuple[StackResource, list[Any], list[Any]]]:
    """Each attachment of managed policies to roles: the resource, the policies' ARNs, the roles it names."""
    found = []
    for r in resources:
        if r.type == ROLE_POLICY_ATTACHMENT:
            found.append((r, [r.props.get("policyArn")], [r.props.get("role")]))
        elif r.type == POLICY_ATTACHMENT:
            found.append((r, [r.props.get("policyArn")], as_list(r.props.get("roles"))))
        elif r.type == ROLE_POLICY_ATTACHMENTS_EXCLUSIVE:
            found.append((r, as_list(r.props.get("policyArns")), [r.props.get("roleName")]))
    return found


def grantees(bucket: StackResource, resources: Sequence[StackResource]) -> list[Grantee]:
    """Every principal an Allow of the stack grants on the bucket: roles through their role policies,
    inline policies, customer managed policies of the stack and AWS managed policies that allow S3
    on every bucket (attached or in `managedPolicyArns`); and the principals of the bucket policy's
    own Allows (but an account, which only delegates to IAM). A document still unknown grants
    nothing the pack can tell: the rule runs again when it is known."""
    bucket_name = _known_text(bucket.props.get("bucket"))
    bucket_arn = _known_text(bucket.props.get("arn")) or (
        f"arn:aws:s3:::{bucket_name}" if bucket_name else None
    )
    roles = [r for r in resources if r.type == ROLE]

    def grants(resource: StackResource, document: Any) -> bool:
        return _grants_on(document, bucket_arn, bucket.urn in resource.dependencies)

    found: list[Grantee] = []
    for policy in (r for r in resources if r.type == ROLE_POLICY and grants(r, r.props.get("policy"))):
        found += _holders(
            policy, [policy.props.get("role")], roles, f"RolePolicy {_resource_name(policy.urn)}"
        )
    managed = [r for r in resources if r.type == IAM_POLICY and grants(r, r.props.get("policy"))]
    managed_arns = {_known_text(m.props.get("arn")) for m in managed} - {None}

    def allows_bucket(arn: Any, holder: StackResource) -> bool:
        """Whether a managed policy a role holds allows S3 on the bucket: an AWS managed one on every
        bucket, or one of the stack's that does (by its ARN, else by the holder depending on it)."""
        return (
            grants_s3_everywhere(aws_managed_policy(arn) or "")
            or _known_text(arn) in managed_arns
            or (not _known_text(arn) and any(m.urn in holder.dependencies for m in managed))
        )

    for role in roles:
        inline = [dig(p, "policy") for p in items(role.props.get("inlinePolicies"))]
        held = as_list(role.props.get("managedPolicyArns"))
        if any(grants(role, document) for document in inline) or any(
            allows_bucket(arn, role) for arn in held
        ):
            found.append(_role_grantee(role))
    for attachment, arns, references in _attachments(resources):
        if any(allows_bucket(arn, attachment) for arn in arns):
            found += _holders(
                attachment,
                references,
                roles,
                f"{attachment.type.rsplit(':', 1)[-1]} {_resource_name(attachment.urn)}",
            )
    for policy in linked(bucket, "bucket", [r for r in resources if r.type == BUCKET_POLICY], "bucket"):
        for statement in policy_statements(policy.props.get("policy")) or []:
            if not (_allows_s3(statement) and _takes_in_bucket(statement, bucket_arn, True)):
                continue
            principal = dig(statement, "Principal")
            if principal in ("*", {"AWS": "*"}):
                found.append(Grantee('every principal (an Allow to Principal "*")', everyone=True))
                continue
            for value in as_list(dig(principal, "AWS")):
                if _known_text(value) and not _ACCOUNT.fullmatch(value):
                    found.append(Grantee(value, arn=value))
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class EndpointDeny:
    """A bucket policy statement that denies all of the bucket to requests that do not come through
    the endpoints it names (`aws:SourceVpce`), and the principals it holds the denial to."""

    endpoints: tuple[Any, ...]
    # The `Principal` element's AWS principals; None for any principal (`*`).
    principals: tuple[Any, ...] | None
    # `aws:PrincipalArn` conditions: for each operator, its values and whether they take wildcards.
    naming: tuple[tuple[tuple[Any, ...], bool], ...]
    sparing: tuple[tuple[tuple[Any, ...], bool], ...]
    # Conditions the pack does not read, each of which may spare a principal the denial.
    unread: tuple[str, ...]

    def values(self) -> list[Any]:
        return [
            *self.endpoints,
            *(self.principals or ()),
            *(value for values, _ in self.naming + self.sparing for value in values),
        ]

    def scope(self) -> str:
        """How a message names whom the statement denies."""
        if self.unread:
            return f"only under conditions the pack does not read ({', '.join(self.unread)})"
        named = [f"Principal {', '.join(map(str, self.principals))}"] if self.principals is not None else []
        named += [f"aws:PrincipalArn {', '.join(map(str, values))}" for values, _ in self.naming]
        named += [f"principals other than {', '.join(map(str, values))}" for values, _ in self.sparing]
        return f"only to {'; '.join(named)}" if named else "to every principal"


def endpoint_deny(statement: Any) -> EndpointDeny | None:
    """The statement as an EndpointDeny, None when it is none: it does not deny `s3:*` on the bucket
    and `bucket/*`, names no endpoint, or names principals by `NotPrincipal` or a service."""
    resources = as_list(dig(statement, "Resource"))
    if (
        dig(statement, "Effect") != "Deny"
        or not {"s3:*", "*"} & set(as_list(dig(statement, "Action")))
        or not any(str(r).endswith("/*") for r in resources)
        or not any(not str(r).endswith("/*") for r in resources)
        or (isinstance(statement, Mapping) and "NotPrincipal" in statement)
    ):
        return None
    principal = dig(statement, "Principal")
    if principal in ("*", {"AWS": "*"}):
        principals = None
    elif is_unknown(principal):
        principals = (principal,)
    elif isinstance(principal, Mapping) and set(principal) == {"AWS"}:
        principals = tuple(as_list(principal["AWS"]))
    else:
        return None
    condition = dig(statement, "Condition")
    if is_unknown(condition):
        return EndpointDeny((condition,), principals, (), (), ())
    endpoints: list[Any] = []
    naming: list[tuple[tuple[Any, ...], bool]] = []
    sparing: list[tuple[tuple[Any, ...], bool]] = []
    unread: list[str] = []
    for operator, block in condition.items() if isinstance(condition, Mapping) else []:
        base = str(operator).removesuffix("IfExists")
        if is_unknown(block):
            endpoints.append(block)  # unknown until the next run
            continue
        for key, value in block.items() if isinstance(block, Mapping) else [("?", block)]:
            name, values = str(key).lower(), tuple(as_list(value))
            # The `Arn` and `Like` operators take wildcards; `StringEquals` and `StringNotEquals` do not.
            wildcards = base not in ("StringEquals", "StringNotEquals")
            if name == "aws:sourcevpce" and base == "StringNotEquals":
                endpoints += values
            elif name == "aws:principalarn" and base in _NAMING_OPERATORS:
                naming.append((values, wildcards))
            elif name == "aws:principalarn" and base in _SPARING_OPERATORS:
                sparing.append((values, wildcards))
            elif name == "aws:viaawsservice" and base == "Bool" and all(is_false(v) for v in values):
                continue  # what AWS services request for the principal, not the principal's own requests
            else:
                unread.append(f"{operator} {key}")
    if not endpoints:
        return None
    return EndpointDeny(tuple(endpoints), principals, tuple(naming), tuple(sparing), tuple(unread))


def _any(answers: Iterable[bool | None]) -> bool | None:
    found = list(answers)
    return True if True in found else None if None in found else False


def _all(answers: Iterable[bool | None]) -> bool | None:
    found = list(answers)
    return False if False in found else None if None in found else True


def _names(value: str, wildcards: bool, grantee: Grantee) -> bool | None:
    """Whether an `aws:PrincipalArn` value names the grantee; None while its ARN and name are unknown."""
    if grantee.arn:
        return arn_like(value, grantee.arn) if wildcards else value == grantee.arn
    if grantee.role_part:
        parts = value.split(":", 5)
        if len(parts) != 6:
            return wildcards and iam_glob(value, grantee.role_part)
        last = iam_glob(parts[5], grantee.role_part) if wildcards else parts[5] == grantee.role_part
        return last and (iam_glob(parts[2], "iam") if wildcards else parts[2] == "iam")
    return None


def _is_principal(value: str, grantee: Grantee) -> bool | None:
    """Whether a `Principal` value is the grantee, or the account that holds it."""
    account = _ACCOUNT.fullmatch(value)
    if account and grantee.arn:
        return grantee.arn.split(":")[4:5] == [account.group(1) or account.group(2)]
    return None if account else _names(value, False, grantee)


def covers(deny: EndpointDeny, grantee: Grantee) -> bool | None:
    """Whether the statement denies the grantee what does not come through its endpoints; None
    while the grantee's ARN is unknown."""
    if grantee.everyone:
        return deny.principals is None and not (deny.naming or deny.sparing or deny.unread)
    if deny.unread:
        return False
    answers: list[bool | None] = []
    if deny.principals is not None:
        answers.append(_any(_is_principal(str(value), grantee) for value in deny.principals))
    for values, wildcards in deny.naming:
        answers.append(_any(_names(str(value), wildcards, grantee) for value in values))
    for values, wildcards in deny.sparing:
        spared = _any(_names(str(value), wildcards, grantee) for value in values)
        answers.append(None if spared is None else not spared)
    return _all(answers)


def _stack_endpoint(deny: EndpointDeny, policy: StackResource, gateways: Sequence[StackResource]) -> bool:
    """Whether every endpoint the statement names is an S3 gateway endpoint of the stack: by its id
    where known, else (a first preview, or mocks) one of those whose id is unknown that the policy
    depends on."""
    known = {_known_text(g.props.get("id")) for g in gateways} - {None}
    pending = [g for g in gateways if not _known_text(g.props.get("id")) and g.urn in policy.dependencies]
    return len([e for e in deny.endpoints if e not in known]) <= len(pending)


_ENDPOINT_FIX = (
    "add an S3 gateway endpoint (vpc_endpoint_type 'Gateway', service com.amazonaws.<region>.s3) on the "
    "private route tables and a bucket policy statement denying s3:* on the bucket and bucket/* when "
    "aws:SourceVpce is not that endpoint"
)
_UNREAD_FIX = (
    "leave out of the statement every condition but aws:SourceVpce and aws:PrincipalArn, which may spare "
    "a principal the denial"
)
_PRINCIPAL_FIX = (
    "name every role the stack allows on the bucket in the statement's ArnEquals aws:PrincipalArn (from "
    "the role's arn output, so the statement follows the role), or leave the principal condition out"
)


def _endpoint_answer(
    policy: StackResource, gateways: Sequence[StackResource], granted: Sequence[Grantee]
) -> bool | str | None:
    """True when the policy denies every grantee requests that do not come through an S3 gateway
    endpoint of the stack, None while unknown, else what is missing and its fix."""
    statements = policy_statements(policy.props.get("policy"))
    if statements is None:
        return None
    denies = [deny for deny in map(endpoint_deny, statements) if deny]
    if any(is_unknown(value) for deny in denies for value in deny.values()):
        return None
    if not denies:
        return f"'s policy has no statement denying requests that do not come through the VPC's S3 endpoint: {_ENDPOINT_FIX}"
    through_stack = [deny for deny in denies if _stack_endpoint(deny, policy, gateways)]
    if not through_stack:
        named = sorted({str(e) for deny in denies for e in deny.endpoints})
        known = sorted({str(g.props["id"]) for g in gateways if _known_text(g.props.get("id"))})
        theirs = f" (the stack's: {', '.join(known)})" if known else ""
        return (
            f"'s policy requires {', '.join(named)}, which is no S3 gateway endpoint of the stack on a route "
            f"table{theirs}: {_ENDPOINT_FIX}"
        )
    left_out, unknown = [], []
    for grantee in granted:
        answer = _any(covers(deny, grantee) for deny in through_stack)
        if answer is None and grantee.urn in policy.dependencies:
            continue  # a first preview: the policy is built from the role's ARN
        if answer is False:
            left_out.append(grantee.shown)
        elif answer is None:
            unknown.append(grantee.shown)
    fix = _UNREAD_FIX if through_stack[0].unread else _PRINCIPAL_FIX
    if left_out:
        return (
            f"'s policy denies requests that do not come through the S3 endpoint {through_stack[0].scope()}, "
            f"not to {', '.join(left_out)}, which the stack allows on the bucket: {fix}"
        )
    if unknown:
        return (
            f"'s policy may not deny {', '.join(unknown)} requests that do not come through the S3 endpoint: the "
            "stack allows it on the bucket, and its ARN, unknown until it is created, cannot be matched with the "
            f"statement's principals: {fix}"
        )
    return True


@stack_rule(
    "s3-buckets-vpc-endpoint-only",
    MANDATORY,
    description="Every S3 bucket's policy denies every principal the stack allows on it requests that do not come through the stack's S3 gateway endpoint.",
    resources="S3 buckets, their bucket policies, the VPC endpoints, and the IAM roles, role policies, managed policies and attachments that allow S3 on a bucket",
    requires="a bucket policy statement denying `s3:*` on the bucket and `bucket/*` when `aws:SourceVpce` is not (`StringNotEquals`) an S3 gateway endpoint of the stack that joins a route table (by its id where known); its principals (`Principal`, or `ArnEquals`/`ArnLike`/`StringEquals`/`StringLike` on `aws:PrincipalArn`, less those an `...NotEquals`/`...NotLike` spares) take in every role an Allow of the stack grants S3 on the bucket (role policies, inline and customer managed policies, `AmazonS3FullAccess`-like AWS managed ones) and every principal of the bucket policy's Allows; a role whose ARN is unknown counts only if the bucket policy is built from it (depends on it); no other condition narrows the statement (but `Bool` `aws:ViaAWSService` `false`)",
)
def buckets_vpc_endpoint_only(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Credentials that reach a bucket, taken out of the VPC, open nothing: the bucket policy refuses
    every principal the stack lets in any request that does not come through the VPC's S3 gateway
    endpoint (S3 user guide, "Controlling access from VPC endpoints with bucket policies")."""
    policies = [r for r in resources if r.type == BUCKET_POLICY]
    gateways = [r for r in resources if r.type == VPC_ENDPOINT and is_s3_gateway(r) is not False]
    violations = []
    for bucket in (r for r in resources if r.type in BUCKETS):
        granted = grantees(bucket, resources)
        answers = [
            _endpoint_answer(p, gateways, granted) for p in linked(bucket, "bucket", policies, "bucket")
        ]
        if True in answers or None in answers:
            continue
        problem = next((v for v in answers if isinstance(v, str)), f" has no bucket policy: {_ENDPOINT_FIX}")
        violations.append((bucket.urn, f"the bucket{problem}"))
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
