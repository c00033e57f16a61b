"""The EKS cluster's rules: secrets encrypted, control-plane logs on, deletion protection outside dev stacks."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
)

from policy.rules import eks
from tests.harness.policy_resources import (
    AWS_EKS,
    EKS,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
)

ALL_LOGS = list(eks.CONTROL_PLANE_LOG_TYPES)

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # eks-secrets-kms-encrypted
    (
        eks.eks_secrets_encrypted,
        EKS,
        {"encryptionConfigKeyArn": "arn:aws:kms:us-east-2:1:key/k"},
        "dev",
        None,
    ),
    (eks.eks_secrets_encrypted, EKS, {"encryptionConfigKeyArn": UNKNOWN}, "dev", None),
    (
        eks.eks_secrets_encrypted,
        AWS_EKS,
        {"encryptionConfig": {"provider": {"keyArn": UNKNOWN}, "resources": ["secrets"]}},
        "dev",
        None,
    ),
    (eks.eks_secrets_encrypted, EKS, {"name": "c"}, "dev", "encryptionConfigKeyArn"),
    (eks.eks_secrets_encrypted, AWS_EKS, {"name": "c"}, "dev", "encryptionConfig"),
    (
        eks.eks_secrets_encrypted,
        AWS_EKS,
        {"encryptionConfig": {"provider": {"keyArn": "arn:k"}, "resources": []}},
        "dev",
        "['secrets']",
    ),
    # eks-control-plane-logging (advisory)
    (eks.control_plane_logging, EKS, {"enabledClusterLogTypes": ALL_LOGS}, "dev", None),
    (eks.control_plane_logging, AWS_EKS, {"enabledClusterLogTypes": UNKNOWN_ARRAY_VALUE}, "dev", None),
    (
        eks.control_plane_logging,
        EKS,
        {"enabledClusterLogTypes": ["api", "authenticator"]},
        "dev",
        "audit, controllerManager, scheduler",
    ),
    (eks.control_plane_logging, AWS_EKS, {"name": "c"}, "dev", "api, audit"),
    # eks-deletion-protection (advisory)
    (eks.deletion_protection, EKS, {"name": "c"}, "dev", None),
    (eks.deletion_protection, EKS, {"name": "c"}, "team-dev", None),
    (eks.deletion_protection, EKS, {"deletionProtection": True}, "us-east-1", None),
    (eks.deletion_protection, EKS, {"name": "c"}, "us-east-1", "stack us-east-1 is not a dev stack"),
    (eks.deletion_protection, AWS_EKS, {"deletionProtection": False}, "prod", "deletionProtection"),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(eks, CASES)
