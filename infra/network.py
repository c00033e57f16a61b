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
        zones: pulumi.Input[list[str]],
        zone_count: int,
        cluster_name: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        zone_names = pulumi.Output.from_input(zones)
        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}
        private_cidrs, public_cidrs = subnet_cidrs(cidr, zone_count)

        self.vpc = aws.ec2.Vpc(
            name,
            cidr_block=cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": name, **cluster_tag},
            opts=child,
        )
        internet = aws.ec2.InternetGateway(name, vpc_id=self.vpc.id, tags={"Name": name}, opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": internet.id}],
            tags={"Name": f"{name}-public"},
            opts=child,
        )

        self.public_subnets: list[aws.ec2.Subnet] = []
        self.private_subnets: list[aws.ec2.Subnet] = []
        for index in range(zone_count):
            zone = zone_names.apply(lambda names, i=index: names[i])
            public = aws.ec2.Subnet(
                f"{name}-public-{index}",
                vpc_id=self.vpc.id,
                cidr_block=public_cidrs[index],
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{name}-public-{index}", "kubernetes.io/role/elb": "1", **cluster_tag},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{index}", subnet_id=public.id, route_table_id=public_routes.id, opts=child
            )
            self.public_subnets.append(public)
            self.private_subnets.append(
                aws.ec2.Subnet(
                    f"{name}-private-{index}",
                    vpc_id=self.vpc.id,
                    cidr_block=private_cidrs[index],
                    availability_zone=zone,
                    map_public_ip_on_launch=False,
                    tags={
                        "Name": f"{name}-private-{index}",
                        "kubernetes.io/role/internal-elb": "1",
                        **cluster_tag,
                    },
                    opts=child,
                )
            )

        nat_address = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags={"Name": f"{name}-nat"}, opts=child)
        nat = aws.ec2.NatGateway(
            name,
            allocation_id=nat_address.id,
            subnet_id=self.public_subnets[0].id,
            tags={"Name": name},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[internet]),
        )
        private_routes = aws.ec2.RouteTable(
            f"{name}-private",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags={"Name": f"{name}-private"},
            opts=child,
        )
        for index, subnet in enumerate(self.private_subnets):
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{index}", subnet_id=subnet.id, route_table_id=private_routes.id, opts=child
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
