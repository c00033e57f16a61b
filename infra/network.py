"""The VPC: private subnets for nodes in two AZs (the first is the GPU AZ), public subnets for NAT.

EFA traffic cannot leave an AZ, so the GPU node group later takes exactly one private subnet:
`gpu_subnet_id`, the one in the GPU AZ. The second AZ exists because the EKS control plane
needs subnets in two zones. One NAT gateway keeps cost down; nodes reach the image registry and
Hugging Face through it, and have no public IP.
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_aws as aws


def subnet_cidrs(vpc_cidr: str, zones: int) -> tuple[list[str], list[str]]:
    """Split the VPC into /4-of-the-VPC private subnets (pods need many IPs) and small public ones."""
    network = ipaddress.ip_network(vpc_cidr)
    quarters = list(network.subnets(prefixlen_diff=2))
    if zones > 3:
        raise ValueError("the address plan holds three zones at most")
    private = [str(block) for block in quarters[:zones]]
    public = [str(block) for block in list(quarters[3].subnets(prefixlen_diff=4))[:zones]]
    return private, public


class Network(pulumi.ComponentResource):
    """VPC, subnets, internet and NAT gateways, routes, with the tags EKS load balancers look for."""

    def __init__(
        self,
        name: str,
        *,
        cidr: str,
        zones: list[str],
        cluster_name: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}
        private_cidrs, public_cidrs = subnet_cidrs(cidr, len(zones))

        self.vpc = aws.ec2.Vpc(
            name,
            cidr_block=cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": name, **cluster_tag},
            opts=child,
        )

        def routes_to(tier: str, target: dict) -> aws.ec2.RouteTable:
            """The tier's route table, its default route going to `target`."""
            return aws.ec2.RouteTable(
                f"{name}-{tier}",
                vpc_id=self.vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", **target}],
                tags={"Name": f"{name}-{tier}"},
                opts=child,
            )

        def subnets(
            tier: str, cidrs: list[str], elb_role: str, routes: aws.ec2.RouteTable
        ) -> list[aws.ec2.Subnet]:
            """One subnet of the tier per zone, associated with the tier's route table."""
            created = []
            for index, (zone, block) in enumerate(zip(zones, cidrs)):
                subnet = aws.ec2.Subnet(
                    f"{name}-{tier}-{index}",
                    vpc_id=self.vpc.id,
                    cidr_block=block,
                    availability_zone=zone,
                    map_public_ip_on_launch=False,
                    tags={"Name": f"{name}-{tier}-{index}", elb_role: "1", **cluster_tag},
                    opts=child,
                )
                aws.ec2.RouteTableAssociation(
                    f"{name}-{tier}-{index}", subnet_id=subnet.id, route_table_id=routes.id, opts=child
                )
                created.append(subnet)
            return created

        internet = aws.ec2.InternetGateway(name, vpc_id=self.vpc.id, tags={"Name": name}, opts=child)
        self.public_subnets = subnets(
            "public", public_cidrs, "kubernetes.io/role/elb", routes_to("public", {"gateway_id": internet.id})
        )
        nat_address = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags={"Name": f"{name}-nat"}, opts=child)
        nat = aws.ec2.NatGateway(
            name,
            allocation_id=nat_address.id,
            subnet_id=self.public_subnets[0].id,
            tags={"Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[internet]),
        )
        self.private_subnets = subnets(
            "private",
            private_cidrs,
            "kubernetes.io/role/internal-elb",
            routes_to("private", {"nat_gateway_id": nat.id}),
        )

        self.vpc_id = self.vpc.id
        self.private_subnet_ids = [subnet.id for subnet in self.private_subnets]
        self.public_subnet_ids = [subnet.id for subnet in self.public_subnets]
        self.gpu_subnet_id = self.private_subnets[0].id
        self.register_outputs(
            {
                "vpcId": self.vpc_id,
                "privateSubnetIds": self.private_subnet_ids,
                "publicSubnetIds": self.public_subnet_ids,
                "gpuSubnetId": self.gpu_subnet_id,
            }
        )
