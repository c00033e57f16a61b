"""The EKS cluster's rules: secrets encrypted, the VPC CNI on a role of its own, control-plane logs on,
deletion protection outside dev stacks."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
)

from policy.rules import eks, properties
from policy.rules.properties import StackResource
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


CNI = properties.PULUMI_EKS_VPC_CNI
ADDON = properties.EKS_ADDON
ROLE_ARN = "arn:aws:iam::123456789012:role/c-vpc-cni"
OWN_CNI_CLUSTER = StackResource(EKS, "urn:eks", {"name": "c", "useDefaultVpcCni": True}, ())


def cni(type_: str = CNI, dependencies: tuple[str, ...] = ("urn:eks",), **props) -> StackResource:
    base = {"clusterName": "c", "serviceAccountRoleArn": ROLE_ARN}
    if type_ == ADDON:
        base["addonName"] = "vpc-cni"
    return StackResource(type_, f"urn:{type_}", {**base, **props}, dependencies)


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([OWN_CNI_CLUSTER, cni()], None),
        ([OWN_CNI_CLUSTER, cni(serviceAccountRoleArn=UNKNOWN)], None),
        # An update's preview: linked by the known cluster name; a first preview's: an unknown one.
        ([OWN_CNI_CLUSTER, cni(ADDON, dependencies=())], None),
        ([OWN_CNI_CLUSTER, cni(ADDON, dependencies=(), clusterName=UNKNOWN)], None),
        (
            [
                OWN_CNI_CLUSTER,
                cni(
                    ADDON,
                    serviceAccountRoleArn=None,
                    podIdentityAssociations=[{"serviceAccount": "aws-node", "roleArn": ROLE_ARN}],
                ),
            ],
            None,
        ),
        # pulumi-eks's own add-on, given a role in the cluster's options.
        ([StackResource(EKS, "urn:eks", {"vpcCniOptions": {"serviceAccountRoleArn": ROLE_ARN}}, ())], None),
        ([StackResource(EKS, "urn:eks", {"autoMode": {"enabled": True}}, ())], None),
        # Other add-ons are not the CNI's.
        ([OWN_CNI_CLUSTER, cni(), cni(ADDON, addonName="coredns", serviceAccountRoleArn=None)], None),
        ([OWN_CNI_CLUSTER, cni(serviceAccountRoleArn=None)], "sets no serviceAccountRoleArn"),
        ([OWN_CNI_CLUSTER, cni(ADDON, serviceAccountRoleArn="")], "sets no serviceAccountRoleArn"),
        (
            [StackResource(EKS, "urn:eks", {"vpcCniOptions": {"enableNetworkPolicy": True}}, ())],
            "gets no role",
        ),
        ([OWN_CNI_CLUSTER], "has no vpc-cni add-on in the stack"),
        ([OWN_CNI_CLUSTER, cni(ADDON, dependencies=(), clusterName="other")], "has no vpc-cni add-on"),
        ([StackResource(AWS_EKS, "urn:eks", {"name": "c"}, ())], "has no vpc-cni add-on in the stack"),
    ],
)
def test_vpc_cni_irsa(resources, expected):
    violations = eks.vpc_cni_irsa.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
