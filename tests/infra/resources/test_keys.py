"""The stack's KMS keys: every one rotates, waits 30 days before deletion, and keeps the account's
statement first in its policy."""

from __future__ import annotations

import json

from infra.resources.keys import DELETION_WINDOW_DAYS, account_statement
from tests.harness.program import ACCOUNT


def test_the_account_manages_the_key():
    assert account_statement(ACCOUNT) == {
        "Sid": "AccountManagesTheKey",
        "Effect": "Allow",
        "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
        "Action": "kms:*",
        "Resource": "*",
    }


def test_every_key_rotates_and_waits_the_longest_window_before_deletion(stack_plan):
    config, plan = stack_plan
    keys = plan.of_type("aws:kms/key:Key")
    assert sorted(key.name for key in keys) == sorted(
        [f"{config['eks-ray-train:clusterName']}-secrets", "checkpoints"]
    )
    assert DELETION_WINDOW_DAYS == 30  # KMS's default and longest (KMS developer guide)
    for key in keys:
        assert key.inputs["enableKeyRotation"] is True, key.name
        assert key.inputs["deletionWindowInDays"] == DELETION_WINDOW_DAYS, key.name
        assert json.loads(key.inputs["policy"])["Statement"][0] == account_statement(ACCOUNT), key.name
