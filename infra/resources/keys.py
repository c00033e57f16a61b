"""The stack's customer-managed KMS keys: each rotates yearly, waits 30 days before deletion, and
keeps the account's statement in its key policy.

Two keys: the cluster's (Kubernetes secrets, control-plane logs; `infra.resources.cluster`) and the
checkpoint bucket's (`infra.resources.storage`), which `pulumi destroy` leaves enabled while it keeps
the bucket (`checkpointsForceDestroy` false): checkpoints outlive the stack only with their key.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

# The waiting period between ScheduleKeyDeletion and the key's deletion: KMS's default and its
# longest (KMS developer guide, "Deleting AWS KMS keys": 7 to 30 days, 30 by default). A key
# scheduled by mistake, with every checkpoint or secret it encrypts, can be recovered that long.
DELETION_WINDOW_DAYS = 30


def account_statement(account_id: str) -> dict[str, Any]:
    """The default key policy's statement: the account manages the key, and IAM policies in the
    account may grant its use (KMS developer guide, "Default key policy")."""
    return {
        "Sid": "AccountManagesTheKey",
        "Effect": "Allow",
        "Principal": {"AWS": f"arn:aws:iam::{account_id}:root"},
        "Action": "kms:*",
        "Resource": "*",
    }


def customer_key(
    name: str, *, description: str, policy: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> aws.kms.Key:
    """A symmetric key with automatic yearly rotation and the 30-day deletion window."""
    return aws.kms.Key(
        name,
        description=description,
        enable_key_rotation=True,
        deletion_window_in_days=DELETION_WINDOW_DAYS,
        policy=policy,
        opts=opts,
    )
