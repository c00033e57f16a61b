"""IAM: roles for service accounts trusted for one service account and audience, their tokens short,
and S3 rights held to prefixes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .properties import (
    IAM_POLICY,
    ROLE,
    ROLE_POLICY,
    SERVICE_ACCOUNT,
    as_list,
    dig,
    is_unknown,
    items,
    policy_statements,
)
from .registry import MANDATORY, resource_rule

# The audience of the tokens EKS's pod identity webhook projects (its default `eks.amazonaws.com/audience`).
STS_AUDIENCE = "sts.amazonaws.com"
# IRSA's service account annotations (amazon-eks-pod-identity-webhook README) and the longest token
# lifetime the pack admits: an hour, where the webhook's default is a day (86400 s).
ROLE_ARN_ANNOTATION = "eks.amazonaws.com/role-arn"
TOKEN_EXPIRATION_ANNOTATION = "eks.amazonaws.com/token-expiration"
TOKEN_EXPIRATION_MAX_S = 3600
# Condition operators that hold `s3:prefix` to the values they list.
PREFIX_OPERATORS = ("StringEquals", "StringEqualsIfExists", "StringLike", "StringLikeIfExists")
_BUCKET_ARN = re.compile(r"arn:[a-z-]+:s3:::[^/]+")
_EVERY_OBJECT = re.compile(r"\*|arn:[a-z-]+:s3:::(\*|[^/]+/\*)")


def _condition_values(equals: Mapping[str, Any], suffix: str) -> list[Any]:
    """Every value a `StringEquals` block holds for the keys ending in `suffix` (`:sub`, `:aud`)."""
    return [value for key, values in equals.items() if key.endswith(suffix) for value in as_list(values)]


def _web_identity_problems(statement: Any) -> list[str]:
    """What an Allow of `sts:AssumeRoleWithWebIdentity` from an OIDC provider lacks: `StringEquals`
    on the issuer's `:sub` (one service account per value) and `:aud` (STS)."""
    actions = as_list(dig(statement, "Action"))
    federated = as_list(dig(statement, "Principal", "Federated"))
    if dig(statement, "Effect") != "Allow" or not any("oidc-provider/" in str(f) for f in federated):
        return []
    if not {"sts:AssumeRoleWithWebIdentity", "sts:*", "*"} & set(actions):
        return []
    equals = dig(statement, "Condition", "StringEquals")
    if is_unknown(equals):
        return []
    equals = equals if isinstance(equals, Mapping) else {}
    problems = []
    subjects = _condition_values(equals, ":sub")
    if not subjects:
        problems.append(
            "admits every service account of the cluster: add StringEquals "
            "<issuer>:sub = system:serviceaccount:<namespace>:<name>"
        )
    elif any(not str(s).startswith("system:serviceaccount:") or str(s).count(":") != 3 for s in subjects):
        problems.append(
            "names a :sub that is not one service account (system:serviceaccount:<namespace>:<name>)"
        )
    audiences = _condition_values(equals, ":aud")
    if audiences != [STS_AUDIENCE] and not any(is_unknown(a) for a in audiences):
        problems.append(
            f"does not hold the token's audience to STS: add StringEquals <issuer>:aud = {STS_AUDIENCE}"
        )
    return problems


@resource_rule(
    "irsa-trust-scoped",
    MANDATORY,
    description="A role trusted through the cluster's OIDC provider names one service account and the STS audience.",
    resources="IAM roles",
    requires=f"every statement allowing `sts:AssumeRoleWithWebIdentity` to an OIDC provider has `StringEquals` on `<issuer>:sub` (each value `system:serviceaccount:<namespace>:<name>`) and on `<issuer>:aud` (`{STS_AUDIENCE}`)",
)
def irsa_trust_scoped(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Only the one service account may assume the role (EKS user guide, "Assign IAM roles to
    Kubernetes service accounts"): without `:sub` any pod of the cluster could, and without `:aud` a
    token the cluster issued for another audience would do."""
    if resource_type != ROLE:
        return []
    statements = policy_statements(props.get("assumeRolePolicy")) or []
    return [f"the role's trust {problem}" for s in statements for problem in _web_identity_problems(s)]


@resource_rule(
    "irsa-token-lifetime",
    MANDATORY,
    description=f"A service account mapped to an IAM role gets tokens of at most {TOKEN_EXPIRATION_MAX_S} s.",
    resources="Kubernetes ServiceAccounts with `eks.amazonaws.com/role-arn`",
    requires=f"`{TOKEN_EXPIRATION_ANNOTATION}` set, at most {TOKEN_EXPIRATION_MAX_S} (the webhook's default is 86400)",
)
def irsa_token_lifetime(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A service account token taken out of a pod opens the role for its lifetime; the pod identity
    webhook projects a day-long one unless the service account says otherwise."""
    if resource_type != SERVICE_ACCOUNT:
        return []
    annotations = dig(props, "metadata", "annotations")
    if not isinstance(annotations, Mapping) or ROLE_ARN_ANNOTATION not in annotations:
        return []
    lifetime = annotations.get(TOKEN_EXPIRATION_ANNOTATION)
    if is_unknown(lifetime):
        return []
    fix = f"set the annotation {TOKEN_EXPIRATION_ANNOTATION}: '{TOKEN_EXPIRATION_MAX_S}'"
    if lifetime is None:
        return [f"the service account's tokens last the webhook's default 86400 s: {fix}"]
    if not str(lifetime).isdigit() or int(str(lifetime)) > TOKEN_EXPIRATION_MAX_S:
        return [f"{TOKEN_EXPIRATION_ANNOTATION} is {lifetime!r}: {fix}"]
    return []


def _reaches_objects(action: str) -> bool:
    return action in ("*", "s3:*") or (
        action.startswith("s3:") and ("Object" in action or action.endswith("*"))
    )


def _lists(action: str) -> bool:
    return action in ("*", "s3:*", "s3:ListBucket", "s3:List*")


def _prefix_held(statement: Any) -> bool:
    """The statement's condition holds `s3:prefix` to listed prefixes, none of them all of the bucket."""
    condition = dig(statement, "Condition")
    if is_unknown(condition):
        return True
    for operator in PREFIX_OPERATORS:
        prefixes = as_list(dig(condition, operator, "s3:prefix"))
        if prefixes and all(is_unknown(p) or str(p) not in ("", "*", "/*") for p in prefixes):
            return True
    return False


def _s3_scope_problems(statement: Any) -> list[str]:
    if dig(statement, "Effect") != "Allow":
        return []
    actions = [a for a in as_list(dig(statement, "Action")) if isinstance(a, str)]
    resources = [r for r in as_list(dig(statement, "Resource")) if isinstance(r, str) and not is_unknown(r)]
    sid = dig(statement, "Sid")
    name = f"the policy's statement {sid}" if isinstance(sid, str) and sid else "a statement of the policy"
    problems = []
    whole = [r for r in resources if _EVERY_OBJECT.fullmatch(r)]
    reaching = [a for a in actions if _reaches_objects(a)]
    if whole and reaching:
        problems.append(
            f"{name} allows {', '.join(reaching)} on {', '.join(whole)}: every object of the bucket; name the "
            "prefixes the workload uses (arn:aws:s3:::<bucket>/<prefix>/*)"
        )
    buckets = [r for r in resources if r == "*" or _BUCKET_ARN.fullmatch(r)]
    listing = [a for a in actions if _lists(a)]
    if buckets and listing and not _prefix_held(statement):
        problems.append(
            f"{name} allows {', '.join(listing)} on {', '.join(buckets)} for any prefix: add a condition "
            "StringLike (or StringLikeIfExists) s3:prefix naming the workload's prefixes"
        )
    return problems


@resource_rule(
    "s3-access-prefix-scoped",
    MANDATORY,
    description="IAM policies grant S3 object rights under named prefixes and listing with an s3:prefix condition.",
    resources="IAM role policies, managed policies and roles' inline policies",
    requires="no Allow of object actions (`s3:*Object*`, `s3:*`, `*`) on `*` or `arn:aws:s3:::<bucket>/*`; an Allow of `s3:ListBucket` on a bucket has a `StringLike`/`StringEquals` (or `IfExists`) condition on `s3:prefix` naming prefixes",
)
def s3_access_prefix_scoped(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A role's S3 rights cover the prefixes its workload uses, not the whole bucket: the checkpoints'
    runs and corpora, not what else the bucket holds."""
    if resource_type in (ROLE_POLICY, IAM_POLICY):
        documents = [props.get("policy")]
    elif resource_type == ROLE:
        documents = [dig(inline, "policy") for inline in items(props.get("inlinePolicies"))]
    else:
        return []
    return [
        problem
        for document in documents
        for statement in policy_statements(document) or []
        for problem in _s3_scope_problems(statement)
    ]
