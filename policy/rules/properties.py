"""Reading a resource as the engine shows it to a policy: resource types, unknowns, nested values."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pulumi_policy import proxy as policy_proxy

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SUBNET = "aws:ec2/subnet:Subnet"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
AWS_EKS_CLUSTER = "aws:eks/cluster:Cluster"
PULUMI_EKS_CLUSTER = "eks:index:Cluster"
SERVICE = "kubernetes:core/v1:Service"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
BUCKET_VERSIONING = (
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2",
)
VPC = "aws:ec2/vpc:Vpc"
DEFAULT_SECURITY_GROUP = "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup"
NAMESPACE = "kubernetes:core/v1:Namespace"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
# The resources that install a Helm chart into a namespace they name (`namespace`): a release, which
# Helm's own client installs, and a v4 Chart, which renders the chart into objects.
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
HELM_INSTALLS = (HELM_RELEASE, "kubernetes:helm.sh/v4:Chart")
SERVICE_ACCOUNT = "kubernetes:core/v1:ServiceAccount"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ROLE_POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
# Attachments of a managed policy to roles (and users, groups), and of managed policies to a role.
POLICY_ATTACHMENT = "aws:iam/policyAttachment:PolicyAttachment"
ROLE_POLICY_ATTACHMENTS_EXCLUSIVE = "aws:iam/rolePolicyAttachmentsExclusive:RolePolicyAttachmentsExclusive"
IAM_POLICY = "aws:iam/policy:Policy"
KMS_KEY = "aws:kms/key:Key"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
BUCKET_ENCRYPTION = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
EKS_ADDON = "aws:eks/addon:Addon"
PULUMI_EKS_VPC_CNI = "eks:index:VpcCniAddon"


# During preview the engine replaces values it cannot know yet by these strings (one per kind of value).
UNKNOWN_SENTINELS = frozenset(
    {
        policy_proxy.UNKNOWN_BOOLEAN_VALUE,
        policy_proxy.UNKNOWN_NUMBER_VALUE,
        policy_proxy.UNKNOWN_STRING_VALUE,
        policy_proxy.UNKNOWN_ARRAY_VALUE,
        policy_proxy.UNKNOWN_ASSET_VALUE,
        policy_proxy.UNKNOWN_ARCHIVE_VALUE,
        policy_proxy.UNKNOWN_OBJECT_VALUE,
    }
)


def is_unknown(value: Any) -> bool:
    """True for a value the engine cannot know during preview."""
    return isinstance(value, str) and value in UNKNOWN_SENTINELS


def dig(value: Any, *path: str) -> Any:
    """The value at `path` inside nested dicts: None where a step is missing, the sentinel where one is unknown."""
    for key in path:
        if is_unknown(value):
            return value
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def items(value: Any) -> list:
    """A list property's elements; nothing when it is missing or unknown."""
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def is_true(value: Any) -> bool:
    """Booleans arrive as bools at the top level and as "true"/"false" strings inside TF-bridged blocks."""
    return value is True or (isinstance(value, str) and value.lower() == "true")


def is_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.lower() == "false")


def as_list(value: Any) -> list:
    """An IAM policy element that is one value or a list of them, as a list."""
    return [value] if isinstance(value, str) else items(value)


def policy_statements(policy: Any) -> list | None:
    """The statements of a policy document (JSON text or already a dict); None while it is unknown,
    none when it cannot be read."""
    if is_unknown(policy):
        return None
    try:
        document = json.loads(policy) if isinstance(policy, str) else policy
    except ValueError:
        return []
    statements = dig(document, "Statement")
    return [statements] if isinstance(statements, Mapping) else items(statements)


def iam_glob(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM's wildcards: `*` any run of characters, `?` one (actions match case-insensitively)."""
    regex = ".*".join(".".join(re.escape(piece) for piece in part.split("?")) for part in pattern.split("*"))
    return re.fullmatch(regex, value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def arn_like(pattern: str, arn: str) -> bool:
    """`ArnLike`/`ArnEquals`: each of an ARN's six colon-separated parts matched on its own, wildcards included."""
    parts, wanted = pattern.split(":", 5), arn.split(":", 5)
    if len(parts) != 6 or len(wanted) != 6:
        return iam_glob(pattern, arn)
    return all(iam_glob(part, value) for part, value in zip(parts, wanted, strict=True))


def statement_grants(statement: Any, action: str) -> bool:
    """Whether an Allow statement grants `action`: an `Action` pattern names it, or `NotAction` (every
    action but those it names) leaves it out. A statement whose actions are unknown grants nothing
    the pack can tell."""
    if dig(statement, "Effect") != "Allow":
        return False
    if isinstance(statement, Mapping) and "NotAction" in statement:
        excluded = as_list(statement["NotAction"])
        if is_unknown(statement["NotAction"]) or any(is_unknown(pattern) for pattern in excluded):
            return False
        return not any(iam_glob(str(pattern), action, ignore_case=True) for pattern in excluded)
    return any(
        isinstance(pattern, str) and not is_unknown(pattern) and iam_glob(pattern, action, ignore_case=True)
        for pattern in as_list(dig(statement, "Action"))
    )


def statement_reaches(statement: Any, arn: str) -> bool:
    """Whether a statement's resources take in `arn`: a `Resource` pattern names it, or `NotResource`
    (every resource but those it names) leaves it out. Unknown resources take in nothing the pack can tell."""
    if isinstance(statement, Mapping) and "NotResource" in statement:
        excluded = as_list(statement["NotResource"])
        if is_unknown(statement["NotResource"]) or any(is_unknown(pattern) for pattern in excluded):
            return False
        return not any(iam_glob(str(pattern), arn) for pattern in excluded)
    return any(
        isinstance(pattern, str) and not is_unknown(pattern) and iam_glob(pattern, arn)
        for pattern in as_list(dig(statement, "Resource"))
    )


def but(statement: Any, key: str) -> str | None:
    """How a message names a `NotAction`/`NotResource` element: "every action but ..." (None without one)."""
    if not isinstance(statement, Mapping) or key not in statement:
        return None
    noun = "action" if key == "NotAction" else "resource"
    return f"every {noun} but {', '.join(map(str, as_list(statement[key])))} ({key})"


def type_kind(resource_type: str) -> tuple[str, str]:
    """(API group with version, kind) of a Kubernetes type token, e.g. ("ray.io/v1", "RayCluster")."""
    _, module, kind = ([*resource_type.split(":"), "", ""])[:3]
    return module, kind


def stack_of(urn: str) -> str:
    """The stack name inside a URN (`urn:pulumi:<stack>::<project>::<type>::<name>`)."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")


def is_dev_stack(stack: str) -> bool:
    """Dev stacks are thrown away freely: `dev`, `dev-<anything>`, `<anything>-dev`."""
    return stack == "dev" or stack.startswith("dev-") or stack.endswith("-dev")


@dataclass(frozen=True)
class StackResource:
    """What a stack rule needs of a resource: its properties and the URNs it depends on."""

    type: str
    urn: str
    props: Mapping[str, Any]
    dependencies: tuple[str, ...]


def linked(
    resource: StackResource, name_key: str, others: Sequence[StackResource], reference_key: str
) -> list:
    """`others` that point at `resource`: by its known name or id, else by depending on it (first preview)."""
    names = {
        value
        for value in (resource.props.get(name_key), resource.props.get("id"))
        if isinstance(value, str) and value and not is_unknown(value)
    }
    return [
        other
        for other in others
        if resource.urn in other.dependencies or other.props.get(reference_key) in names
    ]
