"""The nodes' rules: IMDSv2 with a hop limit of 1, a node role without the VPC CNI's or ECR's
read-only policy, the GPU node group in one subnet with an EFA interface."""

from __future__ import annotations

import json

import pytest
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_OBJECT_VALUE,
)

from policy.rules import nodes, properties
from policy.rules.properties import StackResource
from tests.harness.policy_resources import (
    ENA_ONLY,
    LT,
    NG,
    UNKNOWN,
    case_ids,
    check_both_outcomes,
    check_case,
    efa_template,
    gpu_group,
    template,
)

# (rule, resource type, props, stack, expected fragment of the violation or None for a pass)
CASES = [
    # imdsv2-required
    (nodes.imdsv2_required, LT, efa_template(), "dev", None),
    (nodes.imdsv2_required, LT, {"metadataOptions": {"httpEndpoint": "disabled"}}, "dev", None),
    (nodes.imdsv2_required, LT, {"metadataOptions": {"httpTokens": UNKNOWN}}, "dev", None),
    (nodes.imdsv2_required, LT, {"metadataOptions": UNKNOWN_OBJECT_VALUE}, "dev", None),
    (nodes.imdsv2_required, NG, {"launchTemplate": {"id": UNKNOWN, "version": UNKNOWN}}, "dev", None),
    (
        nodes.imdsv2_required,
        LT,
        {"metadataOptions": {"httpTokens": "optional"}},
        "dev",
        "httpTokens is 'optional'",
    ),
    (nodes.imdsv2_required, LT, {"description": "no metadata options"}, "dev", "httpTokens is not set"),
    (nodes.imdsv2_required, NG, {"subnetIds": ["subnet-1"]}, "dev", "no launch template"),
    # metadata-hop-limit-1
    (nodes.metadata_hop_limit, LT, efa_template(), "dev", None),
    # Numbers reach a policy as floats (JSON through protobuf).
    (nodes.metadata_hop_limit, LT, {"metadataOptions": {"httpPutResponseHopLimit": 1.0}}, "dev", None),
    (nodes.metadata_hop_limit, LT, {"metadataOptions": {"httpEndpoint": "disabled"}}, "dev", None),
    (nodes.metadata_hop_limit, LT, {"metadataOptions": UNKNOWN_OBJECT_VALUE}, "dev", None),
    (
        nodes.metadata_hop_limit,
        LT,
        {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2.0}},
        "dev",
        "httpPutResponseHopLimit is 2.0",
    ),
    (
        nodes.metadata_hop_limit,
        LT,
        {"metadataOptions": {"httpTokens": "required"}},
        "dev",
        "httpPutResponseHopLimit is not set",
    ),
    # gpu-node-group-single-subnet
    (
        nodes.gpu_node_group_single_subnet,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": ["subnet-a"]},
        "dev",
        None,
    ),
    (
        nodes.gpu_node_group_single_subnet,
        NG,
        {"labels": {"role": "system"}, "subnetIds": ["a", "b"]},
        "dev",
        None,
    ),
    (
        nodes.gpu_node_group_single_subnet,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": UNKNOWN_ARRAY_VALUE},
        "dev",
        None,
    ),
    (
        nodes.gpu_node_group_single_subnet,
        NG,
        {"labels": {"role": "gpu-worker"}, "subnetIds": ["a", UNKNOWN]},
        "dev",
        "has 2 subnets",
    ),
    (
        nodes.gpu_node_group_single_subnet,
        NG,
        {"amiType": "AL2023_x86_64_NVIDIA", "subnetIds": ["a", "b"]},
        "dev",
        "has 2 subnets",
    ),
]


@pytest.mark.parametrize("rule, resource_type, props, stack, expected", CASES, ids=case_ids(CASES))
def test_resource_rule(rule, resource_type, props, stack, expected):
    check_case(rule, resource_type, props, stack, expected)


def test_every_resource_rule_has_passing_and_failing_cases():
    check_both_outcomes(nodes, CASES)


SYSTEM_GROUP = StackResource(
    NG, "urn:ng-system", {"labels": {"role": "system"}, "launchTemplate": {"id": "x"}}, ()
)


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([template("urn:lt-gpu"), gpu_group(), SYSTEM_GROUP], None),
        ([template("urn:lt-gpu", networkInterfaces=UNKNOWN_ARRAY_VALUE), gpu_group()], None),
        # Known ids (an update's preview) link the group to its template without a dependency.
        (
            [template("urn:lt-gpu", id="lt-1"), gpu_group((), launchTemplate={"id": "lt-1", "version": "1"})],
            None,
        ),
        (
            [template("urn:lt-gpu", networkInterfaces=ENA_ONLY), gpu_group()],
            "no network interface with interfaceType 'efa'",
        ),
        (
            [
                template("urn:lt-gpu", networkInterfaces=ENA_ONLY),
                template("urn:lt-other"),
                gpu_group((), launchTemplate={"id": "lt-1"}),
            ],
            "not in this stack",
        ),
        (
            [
                template("urn:lt-gpu", id="lt-1", networkInterfaces=ENA_ONLY),
                template("urn:lt-other", id="lt-2"),
                gpu_group(("urn:lt-other",), launchTemplate={"id": "lt-1"}),
            ],
            "no network interface with interfaceType 'efa'",
        ),
        (
            [StackResource(NG, "urn:ng-gpu", {"amiType": "AL2023_x86_64_NVIDIA", "subnetIds": ["a"]}, ())],
            "has no launch template",
        ),
    ],
)
def test_gpu_node_group_efa(resources, expected):
    violations = nodes.gpu_node_group_efa.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:ng-gpu" and expected in violations[0][1], (
            violations
        )


NODE_TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
)
NODE_ROLE = StackResource(properties.ROLE, "urn:node-role", {"assumeRolePolicy": NODE_TRUST}, ())
WORKER = "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy"
PULL_ONLY = "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly"
READ_ONLY = "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"
CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"


def attached(policy_arn: str, dependencies: tuple[str, ...] = ("urn:node-role",), **props) -> StackResource:
    return StackResource(
        properties.ROLE_POLICY_ATTACHMENT,
        f"urn:{policy_arn}",
        {"role": UNKNOWN, "policyArn": policy_arn, **props},
        dependencies,
    )


@pytest.mark.parametrize(
    "resources, expected",
    [
        ([NODE_ROLE, attached(WORKER), attached(PULL_ONLY)], None),
        # Another role's: the VPC CNI's holds its policy.
        ([NODE_ROLE, attached(WORKER), attached(CNI_POLICY, ("urn:cni-role",))], None),
        # A role whose trust is not known yet cannot be told a node's.
        (
            [
                StackResource(properties.ROLE, "urn:node-role", {"assumeRolePolicy": UNKNOWN}, ()),
                attached(CNI_POLICY),
            ],
            None,
        ),
        ([NODE_ROLE, attached(UNKNOWN)], None),
        ([NODE_ROLE, attached(WORKER), attached(CNI_POLICY)], "holds AmazonEKS_CNI_Policy: give the VPC CNI"),
        ([NODE_ROLE, attached(WORKER), attached(READ_ONLY)], "holds AmazonEC2ContainerRegistryReadOnly"),
        # An update's preview: linked by the role's known name.
        (
            [
                StackResource(
                    properties.ROLE, "urn:node-role", {"name": "node-1", "assumeRolePolicy": NODE_TRUST}, ()
                ),
                attached(READ_ONLY, (), role="node-1"),
            ],
            "AmazonEC2ContainerRegistryPullOnly instead",
        ),
        (
            [
                StackResource(
                    properties.ROLE,
                    "urn:node-role",
                    {"assumeRolePolicy": NODE_TRUST, "managedPolicyArns": [WORKER, CNI_POLICY]},
                    (),
                )
            ],
            "holds AmazonEKS_CNI_Policy",
        ),
    ],
)
def test_node_role_least_privilege(resources, expected):
    violations = nodes.node_role_least_privilege.check(resources)
    if expected is None:
        assert violations == []
    else:
        assert len(violations) == 1 and violations[0][0] == "urn:node-role" and expected in violations[0][1]
