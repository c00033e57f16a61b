"""IAM: roles for service accounts trusted for one service account and audience, their tokens short,
S3 rights held to prefixes, and no AWS managed policy that grants a whole service or the account.

A policy document is read as IAM reads it: an Allow with `NotAction` grants every action but those it
names, one with `NotResource` every resource but those (IAM user guide, "IAM JSON policy elements");
action patterns match case-insensitively, with `*` and `?` wildcards."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .properties import (
    IAM_POLICY,
    POLICY_ATTACHMENT,
    ROLE,
    ROLE_POLICY,
    ROLE_POLICY_ATTACHMENT,
    ROLE_POLICY_ATTACHMENTS_EXCLUSIVE,
    SERVICE_ACCOUNT,
    as_list,
    but,
    dig,
    iam_glob,
    is_unknown,
    items,
    policy_statements,
    statement_grants,
    statement_reaches,
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
# What stands for "any object" and "any bucket" where a statement names what it leaves out
# (`NotAction`, `NotResource`): S3's object actions, and a bucket no name can be (`_` is not a valid
# bucket name), which only a wildcard takes in.
_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
_ANY_BUCKET = "arn:aws:s3:::_"
_ANY_OBJECT = f"{_ANY_BUCKET}/_"
# AWS managed policies that allow S3's object actions on every bucket of the account (their
# documents in the AWS managed policy reference: `s3:*` or `s3:Get*` on `*`, or every action).
S3_WIDE_MANAGED_POLICIES = (
    "AmazonS3FullAccess",
    "AmazonS3ReadOnlyAccess",
    "AdministratorAccess",
    "PowerUserAccess",
)
# AWS managed policies that grant (nearly) every action of the account, with what each grants (their
# documents in the AWS managed policy reference), and the `*FullAccess` ones, each every action of a
# service on all its resources.
ACCOUNT_WIDE_MANAGED_POLICIES = {
    "AdministratorAccess": "every action on every resource",
    "PowerUserAccess": "every action but IAM's, Organizations' and Account's on every resource",
}
FULL_ACCESS_SUFFIX = "FullAccess"
_AWS_MANAGED_POLICY = re.compile(r"arn:aws[a-z-]*:iam::aws:policy/(?:[^/]+/)*([^/]+)")


def _condition_values(equals: Mapping[str, Any], suffix: str) -> list[Any]:
    """Every value a `StringEquals` block holds for the keys ending in `suffix` (`:sub`, `:aud`)."""
    return [value for key, values in equals.items() if key.endswith(suffix) for value in as_list(values)]


def _web_identity_problems(statement: Any) -> list[str]:
    """What an Allow of `sts:AssumeRoleWithWebIdentity` from an OIDC provider lacks: `StringEquals`
    on the issuer's `:sub` (one service account per value) and `:aud` (STS)."""
    federated = as_list(dig(statement, "Principal", "Federated"))
    if not any("oidc-provider/" in str(f) for f in federated):
        return []
    if not statement_grants(statement, "sts:AssumeRoleWithWebIdentity"):
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
    requires=f"every statement allowing `sts:AssumeRoleWithWebIdentity` (by name, by wildcard, or by a `NotAction` that leaves it in) to an OIDC provider has `StringEquals` on `<issuer>:sub` (each value `system:serviceaccount:<namespace>:<name>`) and on `<issuer>:aud` (`{STS_AUDIENCE}`)",
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
    return (
        action in ("*", "s3:*")
        or (action.startswith("s3:") and ("Object" in action or action.endswith("*")))
        or any(iam_glob(action, wanted, ignore_case=True) for wanted in _OBJECT_ACTIONS)
    )


def _lists(action: str) -> bool:
    return action in ("*", "s3:*", "s3:ListBucket", "s3:List*") or iam_glob(
        action, "s3:ListBucket", ignore_case=True
    )


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
    sid = dig(statement, "Sid")
    name = f"the policy's statement {sid}" if isinstance(sid, str) and sid else "a statement of the policy"
    every_action_but = but(statement, "NotAction")
    if every_action_but:
        reaching = [every_action_but] if any(statement_grants(statement, a) for a in _OBJECT_ACTIONS) else []
        listing = [every_action_but] if statement_grants(statement, "s3:ListBucket") else []
    else:
        actions = [a for a in as_list(dig(statement, "Action")) if isinstance(a, str)]
        reaching = [a for a in actions if _reaches_objects(a)]
        listing = [a for a in actions if _lists(a)]
    every_resource_but = but(statement, "NotResource")
    if every_resource_but:
        whole = [every_resource_but] if statement_reaches(statement, _ANY_OBJECT) else []
        buckets = [every_resource_but] if statement_reaches(statement, _ANY_BUCKET) else []
    else:
        resources = [
            r for r in as_list(dig(statement, "Resource")) if isinstance(r, str) and not is_unknown(r)
        ]
        whole = [r for r in resources if _EVERY_OBJECT.fullmatch(r)]
        buckets = [r for r in resources if r == "*" or _BUCKET_ARN.fullmatch(r)]
    problems = []
    if whole and reaching:
        problems.append(
            f"{name} allows {', '.join(reaching)} on {', '.join(whole)}: every object of the bucket; name the "
            "prefixes the workload uses (arn:aws:s3:::<bucket>/<prefix>/*)"
        )
    if buckets and listing and not _prefix_held(statement):
        problems.append(
            f"{name} allows {', '.join(listing)} on {', '.join(buckets)} for any prefix: add a condition "
            "StringLike (or StringLikeIfExists) s3:prefix naming the workload's prefixes"
        )
    return problems


def aws_managed_policy(arn: Any) -> str | None:
    """The name of an AWS managed policy (`arn:aws:iam::aws:policy/<path><name>`); None for any other ARN."""
    if not isinstance(arn, str) or is_unknown(arn):
        return None
    match = _AWS_MANAGED_POLICY.fullmatch(arn)
    return match.group(1) if match else None


# Who a resource gives its managed policies, as the messages say it.
_HOLDERS = {
    ROLE: "the role holds",
    ROLE_POLICY_ATTACHMENT: "the attachment gives its role",
    ROLE_POLICY_ATTACHMENTS_EXCLUSIVE: "the attachments give their role",
    POLICY_ATTACHMENT: "the attachment gives its roles, users and groups",
}


def managed_policies(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """The AWS managed policies a role (`managedPolicyArns`) or an attachment gives, by name."""
    if resource_type in (ROLE_POLICY_ATTACHMENT, POLICY_ATTACHMENT):
        arns = [props.get("policyArn")]
    elif resource_type == ROLE_POLICY_ATTACHMENTS_EXCLUSIVE:
        arns = as_list(props.get("policyArns"))
    elif resource_type == ROLE:
        arns = as_list(props.get("managedPolicyArns"))
    else:
        return []
    return [name for name in map(aws_managed_policy, arns) if name]


def grants_s3_everywhere(policy_name: str) -> bool:
    """Whether an AWS managed policy, by name, allows S3's object actions on every bucket."""
    return policy_name in S3_WIDE_MANAGED_POLICIES


@resource_rule(
    "s3-access-prefix-scoped",
    MANDATORY,
    description="IAM policies grant S3 object rights under named prefixes and listing with an s3:prefix condition.",
    resources="IAM role policies, managed policies, roles' inline and managed policies, and policy attachments",
    requires="no Allow of object actions (`s3:*Object*`, `s3:*`, `*`, or a `NotAction` that leaves them in) on `*`, `arn:aws:s3:::<bucket>/*` or a `NotResource`; an Allow of `s3:ListBucket` on a bucket has a `StringLike`/`StringEquals` (or `IfExists`) condition on `s3:prefix` naming prefixes; no AWS managed policy that allows S3 on every bucket (`"
    + "`, `".join(S3_WIDE_MANAGED_POLICIES)
    + "`), attached to a role or in its `managedPolicyArns`",
)
def s3_access_prefix_scoped(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A role's S3 rights cover the prefixes its workload uses, not the whole bucket: the checkpoints'
    runs and corpora, not what else the bucket holds, nor any other bucket of the account."""
    problems = [
        f"{_HOLDERS[resource_type]} the AWS managed policy {policy}, which allows S3 on every bucket of the "
        "account: detach it and grant the workload's prefixes (arn:aws:s3:::<bucket>/<prefix>/*) in a policy of its own"
        for policy in managed_policies(resource_type, props)
        if grants_s3_everywhere(policy)
    ]
    if resource_type in (ROLE_POLICY, IAM_POLICY):
        documents = [props.get("policy")]
    elif resource_type == ROLE:
        documents = [dig(inline, "policy") for inline in items(props.get("inlinePolicies"))]
    else:
        return problems
    return problems + [
        problem
        for document in documents
        for statement in policy_statements(document) or []
        for problem in _s3_scope_problems(statement)
    ]


def grants_whole_services(policy_name: str) -> bool:
    """Whether an AWS managed policy, by name, grants the account or a whole service."""
    return policy_name in ACCOUNT_WIDE_MANAGED_POLICIES or policy_name.endswith(FULL_ACCESS_SUFFIX)


@resource_rule(
    "iam-no-wide-managed-policies",
    MANDATORY,
    description="No role of the stack holds an AWS managed policy that grants the account or a whole service.",
    resources="IAM roles' managed policies and policy attachments (`RolePolicyAttachment`, `PolicyAttachment`, `RolePolicyAttachmentsExclusive`)",
    requires="no `"
    + "`, no `".join(ACCOUNT_WIDE_MANAGED_POLICIES)
    + f"` and no AWS managed `*{FULL_ACCESS_SUFFIX}` policy (`arn:aws:iam::aws:policy/...`), attached or in a role's `managedPolicyArns`",
)
def iam_no_wide_managed_policies(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Each role holds what its workload does: the pods', the VPC CNI's, the CloudWatch agent's, the
    nodes'. An AWS managed policy that grants every action of a service (or of the account) hands
    whoever takes the role's credentials all of that service's resources in the account."""
    return [
        f"{_HOLDERS[resource_type]} the AWS managed policy {policy}, which grants "
        f"{ACCOUNT_WIDE_MANAGED_POLICIES.get(policy, 'every action of a service on all its resources')}: "
        "detach it and grant the actions and resources the workload uses in a policy of its own"
        for policy in managed_policies(resource_type, props)
        if grants_whole_services(policy)
    ]
