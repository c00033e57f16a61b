"""The KMS rules: keys rotate, wait 30 days before deletion, and lend their use only through a
service or an encryption context."""

from __future__ import annotations

import json

import pytest

from policy.rules import kms, properties
from tests.harness.policy_resources import UNKNOWN, case_ids, check_both_outcomes, check_case

KEY = properties.KMS_KEY
ROOT = {
    "Sid": "AccountManagesTheKey",
    "Effect": "Allow",
    "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
    "Action": "kms:*",
    "Resource": "*",
}
POD_ROLE = "arn:aws:iam::123456789012:role/checkpoints-ray-pods"


def key_policy(*statements: dict) -> dict:
    return {"policy": json.dumps({"Version": "2012-10-17", "Statement": [ROOT, *statements]})}


def use(principal: dict | str, condition: dict | None = None, action=("kms:Encrypt", "kms:Decrypt")) -> dict:
    statement = {"Effect": "Allow", "Principal": principal, "Action": list(action), "Resource": "*"}
    return {**statement, "Condition": condition} if condition is not None else statement


VIA_S3 = {"StringEquals": {"kms:ViaService": "s3.us-east-2.amazonaws.com"}}

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # kms-key-deletion-window
    (kms.kms_key_deletion_window, KEY, {"deletionWindowInDays": 30.0}, "dev", None),
    (kms.kms_key_deletion_window, KEY, {"description": "KMS's default, 30"}, "dev", None),
    (kms.kms_key_deletion_window, KEY, {"deletionWindowInDays": UNKNOWN}, "dev", None),
    (kms.kms_key_deletion_window, KEY, {"deletionWindowInDays": 7.0}, "dev", "deletionWindowInDays is 7"),
    (kms.kms_key_deletion_window, KEY, {"deletionWindowInDays": 29}, "dev", "set it to 30"),
    # kms-key-rotation
    (kms.kms_key_rotation, KEY, {"enableKeyRotation": True}, "dev", None),
    (kms.kms_key_rotation, KEY, {"enableKeyRotation": UNKNOWN}, "dev", None),
    # KMS rotates only symmetric encryption keys.
    (kms.kms_key_rotation, KEY, {"customerMasterKeySpec": "RSA_2048"}, "dev", None),
    (kms.kms_key_rotation, KEY, {"keyUsage": "GENERATE_VERIFY_MAC", "keySpec": "HMAC_256"}, "dev", None),
    (kms.kms_key_rotation, KEY, {"enableKeyRotation": False}, "dev", "enableKeyRotation is false"),
    (kms.kms_key_rotation, KEY, {"description": "k"}, "dev", "enableKeyRotation is not set"),
    # kms-key-use-bound
    (kms.kms_key_use_bound, KEY, key_policy(), "dev", None),
    (kms.kms_key_use_bound, KEY, key_policy(use({"AWS": POD_ROLE}, VIA_S3)), "dev", None),
    (kms.kms_key_use_bound, KEY, {"policy": UNKNOWN}, "dev", None),
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(
            use(
                {"Service": "logs.us-east-2.amazonaws.com"},
                {"ArnLike": {"kms:EncryptionContext:aws:logs:arn": "arn:aws:logs:us-east-2:1:log-group:/g"}},
                ("kms:Encrypt*", "kms:Decrypt*", "kms:GenerateDataKey*", "kms:Describe*"),
            )
        ),
        "dev",
        None,
    ),
    # Describing the key uses no data.
    (kms.kms_key_use_bound, KEY, key_policy(use({"AWS": POD_ROLE}, None, ("kms:DescribeKey",))), "dev", None),
    (kms.kms_key_use_bound, KEY, key_policy(use({"AWS": "123456789012"})), "dev", None),
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(use({"AWS": POD_ROLE})),
        "dev",
        f"allows kms:Encrypt, kms:Decrypt to {POD_ROLE} under no condition",
    ),
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(use("*", {"StringEquals": {"kms:CallerAccount": "123456789012"}}, ("kms:*",))),
        "dev",
        "allows kms:* to * under no condition",
    ),
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(use({"AWS": [POD_ROLE]}, None, ("kms:GenerateDataKey",))),
        "dev",
        "under no condition",
    ),
    # Every action but those that use the key on data (NotAction) uses none; a wildcard may name them.
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(
            {
                "Effect": "Allow",
                "Principal": {"AWS": POD_ROLE},
                "NotAction": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
                "Resource": "*",
            }
        ),
        "dev",
        None,
    ),
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(use({"AWS": POD_ROLE}, None, ("kms:*crypt",))),
        "dev",
        "kms:*crypt",
    ),
    # The wide grant: every action but deleting the key, to the pods' role, under no condition.
    (
        kms.kms_key_use_bound,
        KEY,
        key_policy(
            {
                "Effect": "Allow",
                "Principal": {"AWS": POD_ROLE},
                "NotAction": "kms:ScheduleKeyDeletion",
                "Resource": "*",
            }
        ),
        "dev",
        f"allows every action but kms:ScheduleKeyDeletion (NotAction) to {POD_ROLE} under no condition",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(kms, CASES)
