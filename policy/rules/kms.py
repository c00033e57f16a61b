"""KMS keys: they rotate, wait 30 days before deletion, and lend their use to others only through a
service or an encryption context."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .properties import (
    KMS_KEY,
    as_list,
    but,
    dig,
    iam_glob,
    is_false,
    is_true,
    is_unknown,
    policy_statements,
    statement_grants,
)
from .registry import MANDATORY, resource_rule

# KMS's longest waiting period, and its default (KMS developer guide, "Deleting AWS KMS keys").
MIN_DELETION_WINDOW_DAYS = 30
# Actions that use a key on data, as a key policy names them (wildcards included).
_USE = re.compile(r"\*|kms:\*|kms:(Encrypt|Decrypt|ReEncrypt|GenerateDataKey)\S*")
# The actions that use a key on data, by name: what a pattern or a `NotAction` (every action but) is read against.
_USE_ACTIONS = ("kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey")
_ACCOUNT_ROOT = re.compile(r"\d{12}|arn:[a-z-]+:iam::\d{12}:root")


@resource_rule(
    "kms-key-deletion-window",
    MANDATORY,
    description=f"KMS keys wait {MIN_DELETION_WINDOW_DAYS} days between a scheduled deletion and the deletion.",
    resources="KMS keys",
    requires=f"`deletionWindowInDays` at least {MIN_DELETION_WINDOW_DAYS} (unset is KMS's default, {MIN_DELETION_WINDOW_DAYS})",
)
def kms_key_deletion_window(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A key scheduled for deletion by mistake, with all it encrypts, can be recovered for 30 days."""
    if resource_type != KMS_KEY:
        return []
    window = props.get("deletionWindowInDays")
    if window is None or is_unknown(window) or float(window) >= MIN_DELETION_WINDOW_DAYS:
        return []
    return [
        f"deletionWindowInDays is {float(window):g}: set it to {MIN_DELETION_WINDOW_DAYS}, so a key scheduled for "
        "deletion by mistake can be cancelled for a month"
    ]


@resource_rule(
    "kms-key-rotation",
    MANDATORY,
    description="Symmetric KMS keys rotate their key material yearly.",
    resources="KMS keys (symmetric encryption keys)",
    requires="`enableKeyRotation: true`",
)
def kms_key_rotation(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """KMS rotates only symmetric encryption keys (KMS developer guide, "Rotate AWS KMS keys")."""
    if resource_type != KMS_KEY:
        return []
    spec = props.get("customerMasterKeySpec") or props.get("keySpec")
    usage = props.get("keyUsage")
    if spec not in (None, "SYMMETRIC_DEFAULT") or usage not in (None, "ENCRYPT_DECRYPT"):
        return []
    rotation = props.get("enableKeyRotation")
    if is_true(rotation) or is_unknown(rotation):
        return []
    state = "false" if is_false(rotation) else "not set"
    return [f"enableKeyRotation is {state}: set it to true"]


def _uses(action: str) -> bool:
    """Whether an action pattern takes in an action that uses the key on data."""
    return bool(_USE.fullmatch(action)) or any(
        iam_glob(action, use, ignore_case=True) for use in _USE_ACTIONS
    )


def _binds_use(condition: Any) -> bool:
    """A condition that names the service calling for the principal, or the encryption context."""
    return is_unknown(condition) or any(
        key == "kms:ViaService" or key.startswith("kms:EncryptionContext:")
        for operator in (condition.values() if isinstance(condition, Mapping) else [])
        if isinstance(operator, Mapping)
        for key in operator
    )


@resource_rule(
    "kms-key-use-bound",
    MANDATORY,
    description="A key policy lends the key's use beyond the account only through a service or an encryption context.",
    resources="KMS keys",
    requires="every key-policy statement allowing Encrypt, Decrypt, ReEncrypt or GenerateDataKey (by name, by wildcard, or by a `NotAction` that leaves them in) to a principal other than the account has a `kms:ViaService` or `kms:EncryptionContext:*` condition",
)
def kms_key_use_bound(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """A role the key policy names may use the key only through the service it is meant for (the
    checkpoints' role through S3), a service only for its own data (CloudWatch Logs for one log group)."""
    if resource_type != KMS_KEY:
        return []
    violations = []
    for statement in policy_statements(props.get("policy")) or []:
        every_action_but = but(statement, "NotAction")
        if every_action_but:
            uses = any(statement_grants(statement, action) for action in _USE_ACTIONS)
            actions = [every_action_but] if uses else []
        else:
            actions = [a for a in as_list(dig(statement, "Action")) if isinstance(a, str) and _uses(a)]
        principal = dig(statement, "Principal")
        principals = (
            [principal]
            if principal == "*"
            else as_list(dig(principal, "AWS")) + as_list(dig(principal, "Service"))
        )
        others = [
            p
            for p in principals
            if isinstance(p, str) and not is_unknown(p) and not _ACCOUNT_ROOT.fullmatch(p)
        ]
        if (
            dig(statement, "Effect") == "Allow"
            and actions
            and others
            and not _binds_use(dig(statement, "Condition"))
        ):
            violations.append(
                f"the key policy allows {', '.join(actions)} to {', '.join(others)} under no condition: add "
                "kms:ViaService (e.g. s3.<region>.amazonaws.com) or a kms:EncryptionContext condition"
            )
    return violations
