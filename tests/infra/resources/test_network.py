"""The VPC in the program's plan: its NAT, private subnets, the subnets a GPU zone move keeps, the
default security group, flow logs and the route table the S3 gateway endpoint joins. (Each zone's
blocks alone: tests/infra/aws_rules/test_address_layout.py.)"""

from __future__ import annotations

import ipaddress
import json

import pytest

from infra.aws_rules.address_layout import zone_cidrs
from infra.resources.node_groups import SYSTEM_LABELS
from tests.harness.fake_aws import FakeAws, capacity_reservation
from tests.harness.preview_queries import gpu_group, subnet_with_id
from tests.harness.program import (
    ACCOUNT,
    STACK_FILES,
    Preview,
    Registration,
    config_of,
    dev_config,
    run_program,
    stack_config,
)


def test_network_has_nat_and_private_nodes(stack_plan):
    _, plan = stack_plan
    assert len(plan.of_type("aws:ec2/natGateway:NatGateway")) == 1
    for subnet in plan.of_type("aws:ec2/subnet:Subnet"):
        assert subnet.inputs["mapPublicIpOnLaunch"] is False
        role_tag = "kubernetes.io/role/internal-elb" if "private" in subnet.name else "kubernetes.io/role/elb"
        assert subnet.inputs["tags"][role_tag] == "1"
    private_routes = next(
        r for r in plan.of_type("aws:ec2/routeTable:RouteTable") if r.name.endswith("-private")
    )
    assert "natGatewayId" in private_routes.inputs["routes"][0]


SUBNET = "aws:ec2/subnet:Subnet"


# Inputs of aws.ec2.Subnet whose change makes Pulumi replace the subnet (ForceNew in the AWS provider).
SUBNET_REPLACE_KEYS = ("vpcId", "availabilityZone", "cidrBlock")


def subnets_by_name(plan: Preview) -> dict[str, dict]:
    return {r.name: r.inputs for r in plan.of_type(SUBNET)}


def subnet_conflicts(before: Preview, after: Preview) -> list[str]:
    """Subnets the update would create whose block overlaps a subnet still in the VPC.

    Pulumi replaces a resource by creating the new one before deleting the old, and creates new
    resources before deleting removed ones; EC2's CreateSubnet refuses a block that overlaps any
    subnet of the VPC (InvalidSubnet.Conflict). So every subnet created by the update meets every
    subnet of the first deploy.
    """
    old, new = subnets_by_name(before), subnets_by_name(after)
    created = {
        name: inputs
        for name, inputs in new.items()
        if name not in old or any(old[name].get(k) != inputs.get(k) for k in SUBNET_REPLACE_KEYS)
    }
    return [
        f"{name} ({inputs['cidrBlock']}) overlaps {other} ({existing['cidrBlock']})"
        for name, inputs in created.items()
        for other, existing in old.items()
        if ipaddress.ip_network(inputs["cidrBlock"]).overlaps(ipaddress.ip_network(existing["cidrBlock"]))
    ]


def test_subnet_conflict_check_catches_positional_subnets():
    """The check itself: subnets named by position swap zones when the GPU zone moves, and collide."""

    def plan_of(*subnets: tuple[str, str, str]) -> Preview:
        plan = Preview()
        for name, zone, block in subnets:
            inputs = {"vpcId": "vpc-1", "availabilityZone": zone, "cidrBlock": block}
            plan.resources.append(Registration(SUBNET, name, f"urn:{name}", "", [], inputs, set()))
        return plan

    first = plan_of(("private-0", "us-east-2a", "10.0.0.0/18"), ("private-1", "us-east-2b", "10.0.64.0/18"))
    moved = plan_of(("private-0", "us-east-2b", "10.0.0.0/18"), ("private-1", "us-east-2a", "10.0.64.0/18"))
    assert len(subnet_conflicts(first, moved)) == 2
    assert subnet_conflicts(first, first) == []


@pytest.mark.parametrize(
    "region, move, new_gpu_zone",
    [
        ("us-east-2", {"gpuAz": "us-east-2b"}, "us-east-2b"),
        ("us-east-2", {"capacityReservationId": "cr-0123456789abcdef0"}, "us-east-2c"),
        # Outside the home zones (us-east-1a-c): the GPU zone gets a private subnet of its own.
        ("us-east-1", {"gpuAz": "us-east-1d"}, "us-east-1d"),
    ],
    ids=["gpuAz", "reservation", "gpuAz-outside-home-zones"],
)
def test_moving_the_gpu_zone_keeps_every_other_zones_subnets(region, move, new_gpu_zone):
    stack_file = next(f for f in STACK_FILES if stack_config(f)["aws:region"] == region)
    fake = FakeAws(region=region, reservations={"cr-0123456789abcdef0": capacity_reservation("us-east-2c")})
    first = run_program(config_of(stack_file), fake)
    second = run_program(config_of(stack_file, **move), fake)

    before, after = subnets_by_name(first), subnets_by_name(second)
    for name, inputs in before.items():
        assert name in after, f"{name} would be deleted"
        assert {k: after[name][k] for k in SUBNET_REPLACE_KEYS} == {k: inputs[k] for k in SUBNET_REPLACE_KEYS}
    assert subnet_conflicts(first, second) == []
    gpu_subnet = subnet_with_id(second, gpu_group(second).inputs["subnetIds"][0])
    assert gpu_subnet.inputs["availabilityZone"] == new_gpu_zone
    # The control plane and the system nodes keep their subnets.
    assert plan_cluster_subnets(first) == plan_cluster_subnets(second)


def plan_cluster_subnets(plan: Preview) -> tuple[list, list]:
    cluster = plan.one("eks:index:Cluster").inputs
    system = next(
        r for r in plan.of_type("aws:eks/nodeGroup:NodeGroup") if r.inputs["labels"] == SYSTEM_LABELS
    )
    return cluster["privateSubnetIds"], system.inputs["subnetIds"]


def test_zones_a_to_c_keep_the_blocks_of_the_positional_plan():
    """The earlier plan: private quarters by position, public /22s from the last quarter, GPU zone first.

    A stack deployed in zones a (GPU) and b, the default of every stack file, keeps its blocks and,
    through aliases of the old names, its subnets and route table associations.
    """
    assert zone_cidrs("10.0.0.0/16", "us-east-2a") == ("10.0.0.0/18", "10.0.192.0/22")
    assert zone_cidrs("10.0.0.0/16", "us-east-2b") == ("10.0.64.0/18", "10.0.196.0/22")
    assert zone_cidrs("10.0.0.0/16", "us-east-1d") == ("10.0.224.0/21", "10.0.204.0/22")
    plan = run_program(dev_config(), FakeAws(region="us-east-2"))
    aliases = {
        r.name: r.alias_names
        for r in plan.resources
        if r.type in (SUBNET, "aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    for tier in ("private", "public"):
        assert aliases[f"eks-ray-train-{tier}-us-east-2a"] == [f"eks-ray-train-{tier}-0"]
        assert aliases[f"eks-ray-train-{tier}-us-east-2b"] == [f"eks-ray-train-{tier}-1"]
        assert aliases[f"eks-ray-train-{tier}-us-east-2c"] == []


def test_default_security_group_has_no_rules_and_flow_logs_are_off(stack_plan):
    _, plan = stack_plan
    vpc = plan.one("aws:ec2/vpc:Vpc")
    default_group = plan.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert default_group.inputs["vpcId"] == f"{vpc.name}-id"
    assert not default_group.inputs.get("ingress") and not default_group.inputs.get("egress")
    assert plan.of_type("aws:ec2/flowLog:FlowLog") == []


def test_vpc_flow_logs_go_to_a_log_group_with_the_stacks_retention():
    plan = run_program(dev_config(vpcFlowLogs="true", logRetentionDays="90"), FakeAws(region="us-east-2"))
    flow_log = plan.one("aws:ec2/flowLog:FlowLog").inputs
    group = plan.one("aws:cloudwatch/logGroup:LogGroup", "eks-ray-train-flow-logs")
    assert group.inputs["name"] == "/aws/vpc-flow-logs/eks-ray-train"
    assert group.inputs["retentionInDays"] == 90
    # The mocks' ARN of the log group (tests/harness/program.py gives each resource one from its type and name).
    assert flow_log["logDestination"] == f"arn:aws:service:us-east-2:{ACCOUNT}:loggroup/{group.name}"
    assert (flow_log["trafficType"], flow_log["logDestinationType"]) == ("ALL", "cloud-watch-logs")
    assert flow_log["vpcId"] == f"{plan.one('aws:ec2/vpc:Vpc').name}-id"
    role = plan.one("aws:iam/role:Role", "eks-ray-train-flow-logs")
    [trust] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    delivery = json.loads(
        plan.one("aws:iam/rolePolicy:RolePolicy", "eks-ray-train-flow-logs").inputs["policy"]
    )
    assert delivery["Statement"][0]["Resource"][0] == flow_log["logDestination"]


def test_s3_traffic_of_every_private_subnet_takes_the_gateway_endpoint():
    """The endpoint joins the private route table, which every private subnet uses, the GPU zone's own
    included (here outside the home zones), and not the public one."""
    stack_file = next(f for f in STACK_FILES if stack_config(f)["aws:region"] == "us-east-1")
    plan = run_program(config_of(stack_file, gpuAz="us-east-1d"), FakeAws(region="us-east-1"))
    tables = {r.name: f"{r.name}-id" for r in plan.of_type("aws:ec2/routeTable:RouteTable")}
    [private_table] = [table_id for name, table_id in tables.items() if name.endswith("-private")]
    endpoint = plan.one("aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert endpoint["routeTableIds"] == [private_table]
    associations = plan.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    private_zones = {
        a.name.rsplit("-private-", 1)[1] for a in associations if a.inputs["routeTableId"] == private_table
    }
    assert private_zones == {"us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"}
