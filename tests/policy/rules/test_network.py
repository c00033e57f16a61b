"""The network's rules: no public IP on a node, an API endpoint not open to the internet, each VPC's default security group closed."""

from __future__ import annotations

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
)

from policy.rules import network, properties
from policy.rules.properties import StackResource
from tests.harness.policy_resources import (
    AWS_EKS,
    EKS,
    LT,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
    efa_template,
)

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # nodes-without-public-ips
    (network.nodes_without_public_ips, LT, efa_template(), "dev", None),
    (network.nodes_without_public_ips, LT, {"metadataOptions": {"httpTokens": "required"}}, "dev", None),
    (
        network.nodes_without_public_ips,
        LT,
        efa_template(networkInterfaces=[{"associatePublicIpAddress": UNKNOWN}]),
        "dev",
        None,
    ),
    (network.nodes_without_public_ips, LT, efa_template(networkInterfaces=UNKNOWN_ARRAY_VALUE), "dev", None),
    (network.nodes_without_public_ips, "aws:ec2/subnet:Subnet", {"mapPublicIpOnLaunch": False}, "dev", None),
    (network.nodes_without_public_ips, "aws:ec2/subnet:Subnet", {"cidrBlock": "10.0.0.0/18"}, "dev", None),
    (network.nodes_without_public_ips, EKS, {"nodeAssociatePublicIpAddress": False}, "dev", None),
    (
        network.nodes_without_public_ips,
        LT,
        efa_template(networkInterfaces=[{"associatePublicIpAddress": "true"}]),
        "dev",
        "networkInterfaces[0].associatePublicIpAddress",
    ),
    (
        network.nodes_without_public_ips,
        LT,
        efa_template(networkInterfaces=[{}, {"associatePublicIpAddress": True}]),
        "dev",
        "networkInterfaces[1]",
    ),
    (
        network.nodes_without_public_ips,
        "aws:ec2/subnet:Subnet",
        {"mapPublicIpOnLaunch": True},
        "dev",
        "mapPublicIpOnLaunch",
    ),
    (
        network.nodes_without_public_ips,
        "eks:index:NodeGroupV2",
        {"nodeAssociatePublicIpAddress": True},
        "dev",
        "nodeAssociatePublicIpAddress",
    ),
    # eks-api-not-open-to-internet
    (
        network.eks_api_not_open,
        EKS,
        {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.7/32"]},
        "dev",
        None,
    ),
    (network.eks_api_not_open, EKS, {"publicAccessCidrs": ["0.0.0.0/1", "198.51.100.0/24"]}, "dev", None),
    (network.eks_api_not_open, EKS, {"endpointPublicAccess": False}, "dev", None),
    (
        network.eks_api_not_open,
        EKS,
        {"endpointPublicAccess": True, "publicAccessCidrs": UNKNOWN_ARRAY_VALUE},
        "dev",
        None,
    ),
    (network.eks_api_not_open, AWS_EKS, {"vpcConfig": {"endpointPublicAccess": "false"}}, "dev", None),
    (network.eks_api_not_open, EKS, {"endpointPublicAccess": True}, "dev", "publicAccessCidrs is empty"),
    (network.eks_api_not_open, EKS, {"name": "public by default"}, "dev", "publicAccessCidrs is empty"),
    (
        network.eks_api_not_open,
        EKS,
        {"publicAccessCidrs": ["203.0.113.7/32", "0.0.0.0/0"]},
        "dev",
        "cover 0.0.0.0/0",
    ),
    (
        network.eks_api_not_open,
        EKS,
        {"publicAccessCidrs": ["0.0.0.0/1", UNKNOWN, "128.0.0.0/1"]},
        "dev",
        "cover 0.0.0.0/0",
    ),
    (network.eks_api_not_open, EKS, {"publicAccessCidrs": ["2001:db8::/32", "::/0"]}, "dev", "cover ::/0"),
    (
        network.eks_api_not_open,
        AWS_EKS,
        {"vpcConfig": {"publicAccessCidrs": ["0.0.0.0/0"]}},
        "dev",
        "vpcConfig.publicAccessCidrs cover 0.0.0.0/0",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(network, CASES)


VPC_ = StackResource(properties.VPC, "urn:vpc", {"cidrBlock": "10.0.0.0/16"}, ())


def default_group(**props) -> StackResource:
    return StackResource(
        properties.DEFAULT_SECURITY_GROUP, "urn:dsg", {"vpcId": "vpc-1", **props}, ("urn:vpc",)
    )


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([VPC_, default_group()], None),
        ([VPC_, default_group(ingress=[], egress=[])], None),
        ([VPC_], "keeps AWS's rules"),
        ([VPC_, default_group(egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}])], "has egress rules"),
        ([VPC_, default_group(ingress=[{"protocol": "-1", "self": True}])], "has ingress rules"),
    ],
)
def test_default_security_group_closed(resources, expected):
    violations = network.default_security_group_closed.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and expected in violations[0][1], violations
