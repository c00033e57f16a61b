"""The rule objects and their adapters: through pulumi-policy's own argument types (unknown-checking
proxies, the stack name from the URN, the reported URNs), and the registry."""

from __future__ import annotations

import pytest
from pulumi_policy import (
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import (
    unknown_checking_proxy,
)

from policy.rules import eks, network, nodes, registered, registry
from tests.harness.policy_resources import (
    EKS,
    ENA_ONLY,
    LT,
    NG,
    UNKNOWN,
    efa_template,
    gpu_group,
)

RESOURCE_RULES = [rule for rule in registered() if isinstance(rule, registry.ResourceRule)]


def run_resource_policy(
    rule, resource_type: str, props: dict, stack: str = "dev"
) -> list[tuple[str, str | None]]:
    reported: list[tuple[str, str | None]] = []
    urn = f"urn:pulumi:{stack}::eks-ray-train::{resource_type}::r"
    options = PolicyResourceOptions(False, [], None, [], None, [], None)
    args = ResourceValidationArgs(resource_type, unknown_checking_proxy(props), urn, "r", options, None)
    rule.to_policy().validate(args, lambda message, urn=None: reported.append((message, urn)))
    return reported


def test_resource_policy_reads_unknowns_without_raising():
    props = {"metadataOptions": {"httpEndpoint": "enabled", "httpTokens": UNKNOWN}}
    assert run_resource_policy(nodes.imdsv2_required, LT, props) == []


def test_resource_policy_reports_each_violation():
    props = efa_template(
        networkInterfaces=[{"associatePublicIpAddress": "true"}, {"associatePublicIpAddress": True}]
    )
    assert len(run_resource_policy(network.nodes_without_public_ips, LT, props)) == 2


def test_resource_policy_takes_the_stack_from_the_urn():
    assert run_resource_policy(eks.deletion_protection, EKS, {"name": "c"}, stack="dev") == []
    assert run_resource_policy(eks.deletion_protection, EKS, {"name": "c"}, stack="prod")


def test_stack_policy_links_by_dependency_and_reports_the_group():
    options = PolicyResourceOptions(False, [], None, [], None, [], None)

    def resource(type_: str, urn: str, props: dict, dependencies: list[PolicyResource]) -> PolicyResource:
        return PolicyResource(
            type_,
            unknown_checking_proxy(props),
            urn,
            urn,
            options,
            None,
            None,
            [],
            {"launchTemplate": dependencies},
        )

    ena_template = resource(LT, "urn:lt-gpu", efa_template(networkInterfaces=ENA_ONLY), [])
    group = resource(NG, "urn:ng-gpu", gpu_group().props, [ena_template])
    reported: list[tuple[str, str | None]] = []
    nodes.gpu_node_group_efa.to_policy().validate(
        StackValidationArgs([ena_template, group]), lambda message, urn=None: reported.append((message, urn))
    )
    assert [urn for _, urn in reported] == ["urn:ng-gpu"]


def test_rules_ignore_resources_they_are_not_about():
    unrelated = {"spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}, "mapPublicIpOnLaunch": True}
    for rule in RESOURCE_RULES:
        assert rule.check("aws:s3/bucket:Bucket", unrelated, "prod") == [], rule.name


def test_a_second_rule_of_the_same_name_is_refused():
    taken = network.nodes_without_public_ips
    with pytest.raises(ValueError, match="nodes-without-public-ips is registered twice"):
        registry.resource_rule(taken.name, taken.enforcement, description="", resources="", requires="")(
            taken.check
        )
    assert registered().count(taken) == 1
