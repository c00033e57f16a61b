"""The EKS cluster's rules: secrets encrypted, control-plane logs on, deletion protection outside dev stacks."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
)

from policy.rules import eks, registered, registry
from tests.harness.policy_resources import (
    AWS_EKS,
    EKS,
    UNKNOWN,
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


@pytest.mark.parametrize(
    "rule, resource_type, props, stack, expected",
    CASES,
    ids=[f"{case[0].name}-{'fails' if case[4] else 'passes'}-{index}" for index, case in enumerate(CASES)],
)
def test_resource_rule(rule, resource_type, props, stack, expected):
    violations = rule.check(resource_type, props, stack)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0], violations


def test_every_resource_rule_has_passing_and_failing_cases():
    area = [
        rule
        for rule in registered()
        if isinstance(rule, registry.ResourceRule) and rule.check.__module__ == eks.__name__
    ]
    assert area
    for rule in area:
        outcomes = {case[4] is None for case in CASES if case[0] is rule}
        assert outcomes == {True, False}, f"{rule.name} lacks a passing or a failing case"
