"""The VPC: private subnets for nodes, public subnets for NAT, each named and addressed by its zone.

A subnet's resource name and CIDR block depend on its zone alone (the zone's letter picks its
slice of the VPC: `infra.aws_rules.address_layout`), never on which zone holds the GPU nodes. Moving
the GPU zone (`gpuAz`, a capacity reservation) therefore leaves every existing subnet as it is:
Pulumi replaces a subnet whose zone or block changes by creating the new one first, and EC2 refuses
a block that overlaps a subnet still in the VPC (`InvalidSubnet.Conflict`).

The home zones (up to three, chosen without regard to the GPU zone) get a private and a public
subnet each; they carry the EKS control plane and the system nodes. The GPU node group takes one
private subnet, `gpu_subnet_id`: a home zone's, or one of its own when the GPU zone is elsewhere
(EFA traffic cannot leave a zone). One NAT gateway keeps cost down; nodes reach the image
registry and Hugging Face through it, and have no public IP.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.aws_rules.address_layout import zone_cidrs

# NAT gateways the network has, each with its Elastic IP: one, in the first public subnet, whose hourly
# price (and its address's) the stack pays whatever the nodes do (`infra.planner.cost`).
NAT_GATEWAYS = 1


def flow_log_group(cluster_name: str) -> str:
    """Where the VPC's flow logs go, when they are on."""
    return f"/aws/vpc-flow-logs/{cluster_name}"


def flow_log_trust_policy(account_id: str) -> str:
    """VPC Flow Logs may assume the delivery role, for flow logs of this account only (VPC user
    guide, "IAM role for publishing flow logs to CloudWatch Logs")."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                    "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
                }
            ],
        }
    )


def flow_log_delivery_policy(log_group_arn: str) -> str:
    """Write log streams and events into the flow-log group, nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": [
                        "logs:CreateLogStream",
                        "logs:PutLogEvents",
                        "logs:DescribeLogGroups",
                        "logs:DescribeLogStreams",
                    ],
                    "Resource": [log_group_arn, f"{log_group_arn}:*"],
                }
            ],
        }
    )


class Network(pulumi.ComponentResource):
    """VPC, subnets, internet and NAT gateways, routes, with the tags EKS load balancers look for."""

    def __init__(
        self,
        name: str,
        *,
        cidr: str,
        home_zones: list[str],
        gpu_zone: str,
        positional_zones: list[str],
        cluster_name: str,
        flow_log_retention_days: int | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`flow_log_retention_days`: record flow logs, kept that many days; None: no flow logs.

        `positional_zones`: the zones in the order the earlier layout named subnets `<tier>-<position>`
        (the GPU zone first); a subnet there takes its old name as an alias, so stacks deployed with that
        layout keep their subnets and route table associations."""
        super().__init__("eks-ray-train:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}

        self.vpc = aws.ec2.Vpc(
            name,
            cidr_block=cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": name, **cluster_tag},
            opts=child,
        )

        # The VPC's default security group, which admits all traffic among its members and out, with
        # every rule removed: nothing here uses it, and anything placed in it by mistake stays cut off.
        self.default_security_group = aws.ec2.DefaultSecurityGroup(
            name, vpc_id=self.vpc.id, tags={"Name": f"{name}-default-closed"}, opts=child
        )
        if flow_log_retention_days is not None:
            self._flow_logs(name, flow_log_retention_days, cluster_name)

        def routes_to(tier: str, target: dict) -> aws.ec2.RouteTable:
            """The tier's route table, its default route going to `target`."""
            return aws.ec2.RouteTable(
                f"{name}-{tier}",
                vpc_id=self.vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", **target}],
                tags={"Name": f"{name}-{tier}"},
                opts=child,
            )

        def subnet(tier: str, zone: str, elb_role: str, routes: aws.ec2.RouteTable) -> aws.ec2.Subnet:
            """The tier's subnet in `zone`, associated with the tier's route table."""
            private_block, public_block = zone_cidrs(cidr, zone)
            aliases = (
                [pulumi.Alias(name=f"{name}-{tier}-{positional_zones.index(zone)}")]
                if zone in positional_zones
                else []
            )
            named = pulumi.ResourceOptions(parent=self, aliases=aliases)
            created = aws.ec2.Subnet(
                f"{name}-{tier}-{zone}",
                vpc_id=self.vpc.id,
                cidr_block=private_block if tier == "private" else public_block,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{name}-{tier}-{zone}", elb_role: "1", **cluster_tag},
                opts=named,
            )
            associations.append(
                aws.ec2.RouteTableAssociation(
                    f"{name}-{tier}-{zone}", subnet_id=created.id, route_table_id=routes.id, opts=named
                )
            )
            return created

        associations: list[aws.ec2.RouteTableAssociation] = []

        internet = aws.ec2.InternetGateway(name, vpc_id=self.vpc.id, tags={"Name": name}, opts=child)
        public_routes = routes_to("public", {"gateway_id": internet.id})
        self.public_subnets = [
            subnet("public", zone, "kubernetes.io/role/elb", public_routes) for zone in home_zones
        ]
        nat_address = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags={"Name": f"{name}-nat"}, opts=child)
        nat = aws.ec2.NatGateway(
            name,
            allocation_id=nat_address.id,
            subnet_id=self.public_subnets[0].id,
            tags={"Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[internet]),
        )
        private_routes = routes_to("private", {"nat_gateway_id": nat.id})
        private = {
            zone: subnet("private", zone, "kubernetes.io/role/internal-elb", private_routes)
            for zone in dict.fromkeys([*home_zones, gpu_zone])
        }
        # What nodes of the private subnets need to reach the internet (image registries, Hugging
        # Face): node groups wait for it, or their first nodes fail to pull and never join.
        self.private_egress: list[pulumi.Resource] = [nat, private_routes, *associations]
        self.private_subnets = [private[zone] for zone in home_zones]
        # Every private subnet's, the GPU zone's included: where a gateway endpoint's routes go.
        self.private_route_table_ids = [private_routes.id]

        self.vpc_id = self.vpc.id
        self.private_subnet_ids = [s.id for s in self.private_subnets]
        self.public_subnet_ids = [s.id for s in self.public_subnets]
        self.gpu_subnet_id = private[gpu_zone].id
        # Known at preview: the GPU nodes' addresses, where the Ray pods reach their node's EFA counter reader.
        self.gpu_subnet_cidr = zone_cidrs(cidr, gpu_zone)[0]
        self.register_outputs(
            {
                "vpcId": self.vpc_id,
                "privateSubnetIds": self.private_subnet_ids,
                "publicSubnetIds": self.public_subnet_ids,
                "gpuSubnetId": self.gpu_subnet_id,
                "privateRouteTableIds": self.private_route_table_ids,
            }
        )

    def _flow_logs(self, name: str, retention_days: int, cluster_name: str) -> None:
        """All of the VPC's traffic, accepted and rejected, to a CloudWatch log group with a retention."""
        child = pulumi.ResourceOptions(parent=self)
        group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs",
            name=flow_log_group(cluster_name),
            retention_in_days=retention_days,
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-flow-logs",
            assume_role_policy=flow_log_trust_policy(aws.get_caller_identity().account_id),
            opts=child,
        )
        delivery = aws.iam.RolePolicy(
            f"{name}-flow-logs",
            role=role.id,
            policy=group.arn.apply(flow_log_delivery_policy),
            opts=child,
        )
        aws.ec2.FlowLog(
            name,
            vpc_id=self.vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=group.arn,
            iam_role_arn=role.arn,
            tags={"Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[delivery]),
        )
