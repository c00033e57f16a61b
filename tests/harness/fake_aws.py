"""A fake AWS account that answers the AWS provider's invokes under Pulumi mocks.

The facts are real: instance types as `ec2:DescribeInstanceTypes` reports them and the zones
that offer them as a recent `ec2:DescribeInstanceTypeOfferings` snapshot lists them (the one
moto 5.2 ships), keyed the way the pulumi-aws invoke results are (camelCase). Tests change only
what they are about: a quota, an offering, a reservation.

`FakeAwsMocks` plugs a `FakeAws` into `pulumi.runtime.set_mocks`. Provider failures (an unknown
instance type, a missing reservation) reach the program the way the engine delivers them, as a
gRPC error, so a program that catches the invoke's exception behaves as it would in a real
`pulumi preview`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pulumi

ACCOUNT_ID = "123456789012"

# Zone names in the order EC2 lists them, with the zone IDs of one account (names map to
# different physical zones in each account; IDs do not). us-east-1e is use1-az3 here, a zone
# where EKS does not place control planes.
ZONE_IDS: dict[str, dict[str, str]] = {
    "us-east-1": {
        "us-east-1a": "use1-az6",
        "us-east-1b": "use1-az1",
        "us-east-1c": "use1-az2",
        "us-east-1d": "use1-az4",
        "us-east-1e": "use1-az3",
        "us-east-1f": "use1-az5",
    },
    "us-east-2": {"us-east-2a": "use2-az1", "us-east-2b": "use2-az2", "us-east-2c": "use2-az3"},
    "us-west-2": {
        "us-west-2a": "usw2-az2",
        "us-west-2b": "usw2-az1",
        "us-west-2c": "usw2-az3",
        "us-west-2d": "usw2-az4",
    },
    "eu-west-1": {"eu-west-1a": "euw1-az3", "eu-west-1b": "euw1-az1", "eu-west-1c": "euw1-az2"},
    "eu-central-1": {"eu-central-1a": "euc1-az1", "eu-central-1b": "euc1-az2", "eu-central-1c": "euc1-az3"},
    "ap-northeast-1": {
        "ap-northeast-1a": "apne1-az4",
        "ap-northeast-1c": "apne1-az1",
        "ap-northeast-1d": "apne1-az2",
    },
}
REGION_AZS: dict[str, list[str]] = {region: list(zones) for region, zones in ZONE_IDS.items()}

# `eks:DescribeClusterVersions` without filters: the versions EKS creates clusters of, each with its
# `versionStatus`. EKS keeps a version in standard support for 14 months after its release and in
# extended support 12 more (EKS user guide, "Understand the Kubernetes version lifecycle on EKS");
# the statuses follow that calendar at the end of 2026, the shape is the API's.
EKS_VERSIONS: dict[str, str] = {
    "1.36": "STANDARD_SUPPORT",
    "1.35": "STANDARD_SUPPORT",
    "1.34": "STANDARD_SUPPORT",
    "1.33": "EXTENDED_SUPPORT",
    "1.32": "EXTENDED_SUPPORT",
}

# `eks:DescribeAddonVersions` for coredns, newest first per Kubernetes version: each CoreDNS
# build EKS ships is compatible with a range of cluster versions (the names follow EKS's
# `v<coredns>-eksbuild.<n>` scheme; the numbers are illustrative).
COREDNS_VERSIONS: dict[str, str] = {
    "1.36": "v1.13.2-eksbuild.1",
    "1.35": "v1.13.2-eksbuild.1",
    "1.34": "v1.12.4-eksbuild.3",
    "1.33": "v1.12.4-eksbuild.3",
    "1.32": "v1.11.4-eksbuild.14",
}

# The same for the CloudWatch Observability add-on (EKS names its builds `v<chart>-eksbuild.<n>`;
# 6.4.0 is the chart whose values.yaml tests/fixtures/schemas holds; the builds are illustrative).
OBSERVABILITY_VERSIONS: dict[str, str] = dict.fromkeys(EKS_VERSIONS, "v6.4.0-eksbuild.1")
# The same for the EKS node monitoring agent (its builds `v<agent>-eksbuild.<n>`, as its chart's image
# tag names them, aws/eks-node-monitoring-agent charts/eks-node-monitoring-agent/values.yaml; the
# builds per Kubernetes version are illustrative).
NODE_MONITORING_VERSIONS: dict[str, str] = dict.fromkeys(EKS_VERSIONS, "v1.7.0-eksbuild.1")
# The same for the two add-ons pulumi-eks makes: the VPC CNI (builds `v<cni>-eksbuild.<n>`, one CNI
# release for several Kubernetes versions) and kube-proxy (a build per Kubernetes minor version,
# `v<kubernetes>.<patch>-eksbuild.<n>`); the numbers are illustrative.
VPC_CNI_VERSIONS: dict[str, str] = {
    "1.36": "v1.21.1-eksbuild.1",
    "1.35": "v1.21.1-eksbuild.1",
    "1.34": "v1.20.4-eksbuild.2",
    "1.33": "v1.20.4-eksbuild.2",
    "1.32": "v1.19.6-eksbuild.7",
}
KUBE_PROXY_VERSIONS: dict[str, str] = {version: f"v{version}.0-eksbuild.2" for version in EKS_VERSIONS}
ADDON_VERSIONS = {
    "coredns": COREDNS_VERSIONS,
    "amazon-cloudwatch-observability": OBSERVABILITY_VERSIONS,
    "eks-node-monitoring-agent": NODE_MONITORING_VERSIONS,
    "vpc-cni": VPC_CNI_VERSIONS,
    "kube-proxy": KUBE_PROXY_VERSIONS,
}

REGION_DESCRIPTIONS = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "Europe (Ireland)",
    "eu-central-1": "Europe (Frankfurt)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
}


# On-Demand Linux list prices per hour, US$, as the Price List gives them (aws.amazon.com/ec2/pricing/
# on-demand; the same in each region faked here, which is true of us-east-1 and us-east-2 only: the
# other regions' figures are stand-ins).
LIST_PRICES: dict[str, str] = {
    "g6.12xlarge": "4.6016000000",
    "m7i.xlarge": "0.2016000000",
    "m5.large": "0.0960000000",
    "p5.48xlarge": "55.0400000000",
}
# Types the Price List also lists as Capacity Block products: `marketoption` CapacityBlock, operation
# `RunInstances:CB`, every other attribute of the On-Demand product alike (pricing:GetAttributeValues
# of AmazonEC2 `marketoption`: OnDemand, CapacityBlock; a block's price is its offering's, so the
# product's hourly rate is 0).
CAPACITY_BLOCK_TYPES = ("p4d.24xlarge", "p5.48xlarge")
# Where the Price List API answers (its endpoints; the pulumi-aws pricing data source works only
# with a provider in us-east-1 or ap-south-1).
PRICE_LIST_REGIONS = ("us-east-1", "ap-south-1")


def price_list_item(instance_type: str, region: str, usd: str, market: str = "OnDemand") -> str:
    """One `pricing:GetProducts` PriceList item of a Linux instance type, a JSON text, in the shape
    the AWS Price List API reference (GetProducts) and the Price List user guide ("Service price
    list" files) document: `product` with its `attributes`, `terms.OnDemand.<sku>.<offer
    term>.priceDimensions.<rate code>.pricePerUnit.USD`. JRTCKXETXF is the On-Demand offer term code
    and 6YS6EN2CT7 the hourly rate code of every On-Demand EC2 product; the SKU is made up. `market`:
    the product's `marketoption`, OnDemand or CapacityBlock (`CAPACITY_BLOCK_TYPES`)."""
    sku = "FAKESKU" + instance_type.replace(".", "").upper() + ("CB" if market == "CapacityBlock" else "")
    term = f"{sku}.JRTCKXETXF"
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "location": REGION_DESCRIPTIONS.get(region, region),
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "licenseModel": "No License required",
                    "capacitystatus": "Used",
                    "marketoption": market,
                    "servicecode": "AmazonEC2",
                    "usagetype": f"BoxUsage:{instance_type}",
                    "operation": "RunInstances:CB" if market == "CapacityBlock" else "RunInstances",
                },
                "sku": sku,
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    term: {
                        "priceDimensions": {
                            f"{term}.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${float(usd):.4f} per "
                                f"{'Capacity Block' if market == 'CapacityBlock' else 'On Demand'} Linux "
                                f"{instance_type} Instance Hour",
                                "appliesTo": [],
                                "rateCode": f"{term}.6YS6EN2CT7",
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2026-12-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                }
            },
            "version": "20261201000000",
            "publicationDate": "2026-12-01T00:00:00Z",
        }
    )


def _instance_type(
    vcpus: int,
    cores: int,
    memory_mib: int,
    gpus: list[dict],
    efa_interfaces: int,
    network_cards: int,
    interfaces: int,
    ipv4_per_interface: int,
    network: str,
) -> dict[str, Any]:
    return {
        "defaultVcpus": vcpus,
        "defaultCores": cores,
        "defaultThreadsPerCore": vcpus // cores,
        "memorySize": memory_mib,
        "gpuses": gpus,
        "totalGpuMemory": sum(gpu["count"] * gpu["memorySize"] for gpu in gpus),
        "efaSupported": efa_interfaces > 0,
        "efaMaximumInterfaces": efa_interfaces,
        "maximumNetworkCards": network_cards,
        "maximumNetworkInterfaces": interfaces,
        "maximumIpv4AddressesPerInterface": ipv4_per_interface,
        "networkPerformance": network,
        "supportedArchitectures": ["x86_64"],
        "supportedPlacementStrategies": ["cluster", "partition", "spread"],
        "bareMetal": False,
    }


def _gpus(count: int, name: str, memory_mib: int) -> list[dict]:
    return [{"count": count, "manufacturer": "NVIDIA", "memorySize": memory_mib, "name": name}]


INSTANCE_TYPES: dict[str, dict[str, Any]] = {
    "m5.large": _instance_type(2, 1, 8192, [], 0, 1, 3, 10, "Up to 10 Gigabit"),
    "m7i.xlarge": _instance_type(4, 2, 16384, [], 0, 1, 4, 15, "Up to 12.5 Gigabit"),
    # Graviton: arm64 only.
    "m7g.xlarge": {
        **_instance_type(4, 4, 16384, [], 0, 1, 4, 15, "Up to 12.5 Gigabit"),
        "supportedArchitectures": ["arm64"],
    },
    "g5g.16xlarge": {
        **_instance_type(64, 64, 131072, _gpus(2, "T4g", 16384), 0, 1, 8, 30, "25 Gigabit"),
        "supportedArchitectures": ["arm64"],
    },
    "g4dn.xlarge": _instance_type(4, 2, 16384, _gpus(1, "T4", 16384), 0, 1, 3, 10, "Up to 25 Gigabit"),
    "g6.xlarge": _instance_type(4, 2, 16384, _gpus(1, "L4", 22888), 0, 1, 4, 15, "Up to 10 Gigabit"),
    "g5.12xlarge": _instance_type(48, 24, 196608, _gpus(4, "A10G", 22888), 1, 1, 15, 50, "40 Gigabit"),
    "g6.12xlarge": _instance_type(48, 24, 196608, _gpus(4, "L4", 22888), 1, 1, 8, 30, "40 Gigabit"),
    "g6e.12xlarge": _instance_type(48, 24, 393216, _gpus(4, "L40S", 45776), 1, 1, 10, 30, "100 Gigabit"),
    "g6.48xlarge": _instance_type(192, 96, 786432, _gpus(8, "L4", 22888), 1, 1, 15, 50, "100 Gigabit"),
    "p4d.24xlarge": _instance_type(96, 48, 1179648, _gpus(8, "A100", 40960), 4, 4, 60, 50, "4x 100 Gigabit"),
    "p5.48xlarge": _instance_type(192, 96, 2097152, _gpus(8, "H100", 81920), 32, 32, 64, 50, "3200 Gigabit"),
    # Dedicated Hosts only: no On-Demand vCPU quota.
    "mac2.metal": {
        **_instance_type(8, 4, 16384, [], 0, 1, 8, 30, "10 Gigabit"),
        "supportedArchitectures": ["arm64_mac"],
        "supportedPlacementStrategies": ["partition", "spread"],
        "bareMetal": True,
    },
}


def _zones(region: str, *letters: str) -> list[str]:
    return [f"{region}{letter}" for letter in letters]


# Types that some zones of a region do not offer; every other known type is offered in every zone.
_PARTIAL_OFFERINGS: dict[str, dict[str, Sequence[str]]] = {
    "us-east-1": {
        **dict.fromkeys(
            (
                "m5.large",
                "m7i.xlarge",
                "g4dn.xlarge",
                "g6.xlarge",
                "g5.12xlarge",
                "g6.12xlarge",
                "g6.48xlarge",
            ),
            _zones("us-east-1", "a", "b", "c", "d", "f"),
        ),
        **dict.fromkeys(
            ("g6e.12xlarge", "p4d.24xlarge", "mac2.metal"), _zones("us-east-1", "a", "b", "c", "d")
        ),
    },
    "us-west-2": dict.fromkeys(("g4dn.xlarge", "g5.12xlarge"), _zones("us-west-2", "a", "b", "c")),
    "eu-west-1": {
        **dict.fromkeys(("g6.xlarge", "g6.12xlarge", "g6e.12xlarge", "g6.48xlarge", "p5.48xlarge"), ()),
        "p4d.24xlarge": _zones("eu-west-1", "c"),
        "mac2.metal": _zones("eu-west-1", "b", "c"),
    },
    "eu-central-1": dict.fromkeys(("p5.48xlarge", "mac2.metal"), ()),
    "ap-northeast-1": {
        **dict.fromkeys(
            (
                "g6.xlarge",
                "g5.12xlarge",
                "g6.12xlarge",
                "g6e.12xlarge",
                "g6.48xlarge",
                "p4d.24xlarge",
                "p5.48xlarge",
            ),
            _zones("ap-northeast-1", "a", "c"),
        ),
        "mac2.metal": [],
    },
}

# EC2 On-Demand vCPU quotas: code -> (name, value of a well-provisioned account).
QUOTAS: dict[str, tuple[str, float]] = {
    "L-1216C47A": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 640.0),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", 192.0),
    "L-417A185B": ("Running On-Demand P instances", 384.0),
    "L-1945791B": ("Running On-Demand Inf instances", 128.0),
    "L-2C3B7624": ("Running On-Demand Trn instances", 256.0),
    "L-6E869C2A": ("Running On-Demand DL instances", 96.0),
    "L-74FC7D96": ("Running On-Demand F instances", 64.0),
    "L-7295265B": ("Running On-Demand X instances", 128.0),
    "L-43DA4232": ("Running On-Demand High Memory instances", 448.0),
    "L-F7808C92": ("Running On-Demand HPC instances", 768.0),
}


def capacity_reservation(
    availability_zone: str,
    instance_type: str = "g6.12xlarge",
    instance_count: int = 2,
    available_instance_count: int | None = None,
    state: str | None = "active",
    instance_platform: str = "Linux/UNIX",
    tenancy: str = "default",
    placement_group_arn: str | None = None,
    reservation_type: str | None = "default",
    start_date: datetime | None = None,
    end_date: datetime | None = None,
) -> dict[str, Any]:
    """One entry of `FakeAws.reservations`, keyed like EC2's `DescribeCapacityReservations`.

    `available_instance_count` defaults to `instance_count` (none in use); `state=None` or
    `reservation_type=None` stand for a Cloud Control schema that does not return them.
    `reservation_type` is `default` or `capacity-block` (a Capacity Block for ML, built with
    `capacity_block`); `placement_group_arn` is set on a reservation created in a cluster placement
    group. An ODCR with an `end_date` has `EndDateType` `limited`, one without `unlimited` (EC2 API
    reference, CapacityReservation: `EndDate` is given exactly when `EndDateType` is `limited`).
    """
    return {
        "availabilityZone": availability_zone,
        "instanceType": instance_type,
        "instanceCount": instance_count,
        "availableInstanceCount": instance_count
        if available_instance_count is None
        else available_instance_count,
        "instancePlatform": instance_platform,
        "tenancy": tenancy,
        "instanceMatchCriteria": "targeted",
        "endDateType": "limited" if end_date else "unlimited",
        "startDate": _timestamp(start_date),
        "endDate": _timestamp(end_date),
        "ebsOptimized": True,
        "ephemeralStorage": False,
        "state": state,
        "placementGroupArn": placement_group_arn,
        "reservationType": reservation_type,
    }


def capacity_block(
    availability_zone: str,
    now: datetime,
    starts: timedelta,
    ends: timedelta,
    instance_type: str = "p5.48xlarge",
    instance_count: int = 2,
) -> dict[str, Any]:
    """A Capacity Block for ML whose start and end lie `starts` and `ends` from `now` (negative:
    already passed), in the state EC2 gives it then (EC2 user guide, "View Capacity Blocks"): paid
    for and not started, `scheduled`, with 0 instances available ("Before a Capacity Block
    reservation begins, the available capacity appears as zero"); `active` from its start; `expired`
    from its end, when EC2 has reclaimed its instances. A block always has both dates and
    `EndDateType` `limited`. The guide states only the available count before the start; the total
    stays the block's size here, and the preflight judges neither before the start.
    """
    start, end = now + starts, now + ends
    state = "scheduled" if now < start else "active" if now < end else "expired"
    return capacity_reservation(
        availability_zone,
        instance_type=instance_type,
        instance_count=instance_count,
        available_instance_count=instance_count if state == "active" else 0,
        state=state,
        reservation_type="capacity-block",
        start_date=start,
        end_date=end,
    )


def _timestamp(moment: datetime | None) -> str | None:
    """A reservation date as Cloud Control's JSON carries it: ISO 8601 in UTC (the schema types it a
    plain string; EC2's own API returns the same instant as an ISO 8601 timestamp)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


# `FakeAws.reservations` keys -> the CloudFormation property names Cloud Control returns them under.
# The dates and states are those the resource schema of AWS::EC2::CapacityReservation declares
# readable (`StartDate`, `EndDate`, `EndDateType`, `State`, `ReservationType`, as pulumi-aws-native's
# generated `ec2.get_capacity_reservation` lists them with the schema's descriptions); a reservation
# without an end date carries no `EndDate` at all.
_RESERVATION_PROPERTIES = {
    "availabilityZone": "AvailabilityZone",
    "instanceType": "InstanceType",
    "instancePlatform": "InstancePlatform",
    "tenancy": "Tenancy",
    "instanceCount": "InstanceCount",
    "availableInstanceCount": "AvailableInstanceCount",
    "instanceMatchCriteria": "InstanceMatchCriteria",
    "endDateType": "EndDateType",
    "startDate": "StartDate",
    "endDate": "EndDate",
    "ebsOptimized": "EbsOptimized",
    "ephemeralStorage": "EphemeralStorage",
    "state": "State",
    "placementGroupArn": "PlacementGroupArn",
    "reservationType": "ReservationType",
}


class AwsApiError(Exception):
    """An error the AWS API returned, worded like the provider reports it."""

    def __init__(self, operation: str, code: str, message: str):
        super().__init__(f"operation error {operation}, api error {code}: {message}")
        self.code = code


@dataclass
class FakeAws:
    """One AWS account in one region. `offerings` and `quotas` entries replace the defaults they name.

    `denied` lists invoke tokens the caller's IAM policy does not allow (they fail with AccessDenied),
    `throttled` those AWS keeps throttling (ThrottlingException, "the request was denied due to request
    throttling", a common error of every AWS API, once the provider's retries are spent).
    `instances` are the account's EC2 instances, as `launch_into_reservation` leaves them.
    """

    region: str = "us-east-2"
    offerings: dict[str, list[str]] | None = None
    quotas: dict[str, float] | None = None
    reservations: dict[str, dict] | None = None
    calls: list = field(default_factory=list)
    denied: set[str] = field(default_factory=set)
    throttled: set[str] = field(default_factory=set)
    instances: list[dict] = field(default_factory=list)
    # What runs in the account already (a deployed stack, or what a destroy left): EKS clusters by
    # name ({"version", "vpcId", "subnetIds"}), VPC blocks and subnet zones by id, log groups' tags.
    clusters: dict[str, dict] = field(default_factory=dict)
    # Managed node groups by cluster and name ({"labels", "subnetIds"}, and "status", "scalingConfig"
    # ({"desiredSize", "minSize", "maxSize"}) where a test gives them).
    node_groups: dict[str, dict[str, dict]] = field(default_factory=dict)
    vpcs: dict[str, str] = field(default_factory=dict)
    subnets: dict[str, str] = field(default_factory=dict)
    log_groups: dict[str, dict[str, str]] = field(default_factory=dict)
    # The clusters' managed add-ons: cluster name -> add-on name -> the version it runs.
    addons: dict[str, dict[str, str]] = field(default_factory=dict)
    # The builds EKS offers: add-on name -> Kubernetes version -> the newest build for it, ADDON_VERSIONS
    # until a test publishes a later one.
    addon_builds: dict[str, dict[str, str]] = field(default_factory=lambda: copy.deepcopy(ADDON_VERSIONS))

    def launch_into_reservation(self, reservation_id: str, cluster_name: str, count: int) -> None:
        """`count` nodes of the EKS cluster `cluster_name` start in the reservation, as a deploy leaves them.

        Models EC2: an instance launched into a targeted On-Demand Capacity Reservation (or a
        Capacity Block) takes one of its instances, so `AvailableInstanceCount` drops by one
        for each pending or running instance (EC2 user guide, "Capacity Reservations"). The
        instances carry the `eks:cluster-name` tag that EKS puts on the instances of a managed
        node group (it tags the node group's Auto Scaling group, which propagates it at launch).
        """
        reservation = self.reservations[reservation_id]  # type: ignore[index]
        if reservation["availableInstanceCount"] < count:
            raise AssertionError(
                f"EC2 would fail these launches: InsufficientInstanceCapacity in {reservation_id}"
            )
        reservation["availableInstanceCount"] -= count
        start = len(self.instances)
        self.instances += [
            {
                "id": f"i-{start + index:017x}",
                "state": "running",
                "capacityReservationId": reservation_id,
                "instanceType": reservation["instanceType"],
                "tags": {"eks:cluster-name": cluster_name},
            }
            for index in range(count)
        ]

    def offered_zones(self, instance_type: str) -> list[str]:
        """Zones of the region that offer the type: the test's override, else the real answer."""
        if self.offerings and instance_type in self.offerings:
            return list(self.offerings[instance_type])
        if instance_type not in INSTANCE_TYPES:
            return []
        return list(_PARTIAL_OFFERINGS.get(self.region, {}).get(instance_type, REGION_AZS[self.region]))

    def call(self, token: str, args: dict) -> dict:
        """Answer one invoke as the AWS provider would; raise `AwsApiError` where AWS would fail."""
        self.calls.append((token, copy.deepcopy(args)))
        answer = {
            "aws:ec2/getInstanceType:getInstanceType": self._instance_type,
            "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": self._instance_type_offerings,
            "aws:servicequotas/getServiceQuota:getServiceQuota": self._service_quota,
            "aws:index/getAvailabilityZones:getAvailabilityZones": self._availability_zones,
            "aws:index/getCallerIdentity:getCallerIdentity": self._caller_identity,
            "aws:index/getPartition:getPartition": self._partition,
            "aws:index/getRegion:getRegion": self._region,
            "aws:cloudcontrol/getResource:getResource": self._cloudcontrol_resource,
            "aws:ec2/getInstances:getInstances": self._instances,
            "aws:eks/getClusterVersions:getClusterVersions": self._cluster_versions,
            "aws:eks/getAddonVersion:getAddonVersion": self._addon_version,
            "aws:eks/getAddon:getAddon": self._addon,
            "aws:eks/getCluster:getCluster": self._cluster,
            "aws:eks/getNodeGroups:getNodeGroups": self._node_groups,
            "aws:eks/getNodeGroup:getNodeGroup": self._node_group,
            "aws:ec2/getVpc:getVpc": self._vpc,
            "aws:ec2/getSubnet:getSubnet": self._subnet,
            "aws:cloudwatch/getLogGroup:getLogGroup": self._log_group,
            "aws:pricing/getProduct:getProduct": self._product,
        }.get(token)
        if answer is None:
            raise NotImplementedError(
                f"FakeAws does not answer the invoke {token}; teach it in tests/harness/fake_aws.py"
            )
        if self.region not in ZONE_IDS:  # the AWS provider refuses to configure for a region it does not know
            raise AwsApiError(token, "InvalidRegion", f"invalid AWS Region: {self.region}")
        if token in self.denied:
            raise AwsApiError(
                token, "AccessDeniedException", f"user/tester is not authorized to perform {token}"
            )
        if token in self.throttled:
            raise AwsApiError(token, "ThrottlingException", "Rate exceeded")
        return answer(args)

    # --- invokes ----------------------------------------------------------------------------------

    def _instance_type(self, args: dict) -> dict:
        name = args["instanceType"]
        if name not in INSTANCE_TYPES:
            raise AwsApiError(
                "EC2: DescribeInstanceTypes",
                "InvalidInstanceType",
                f"The following supplied instance types do not exist: [{name}]",
            )
        return {
            **copy.deepcopy(INSTANCE_TYPES[name]),
            "instanceType": name,
            "id": name,
            "region": self.region,
        }

    def _instance_type_offerings(self, args: dict) -> dict:
        location_type = args.get("locationType", "region")
        filters = {item["name"]: item["values"] for item in args.get("filters") or []}
        unknown = set(filters) - {"instance-type", "location"}
        if unknown:
            raise NotImplementedError(f"FakeAws does not filter offerings by {sorted(unknown)}")
        wanted_types = filters.get("instance-type", list(INSTANCE_TYPES))
        rows = []
        for instance_type in wanted_types:
            zones = self.offered_zones(instance_type)
            if location_type == "availability-zone":
                locations = zones
            elif location_type == "availability-zone-id":
                locations = [ZONE_IDS[self.region][zone] for zone in zones]
            else:
                locations = [self.region] if zones else []
            rows += [(instance_type, location) for location in locations]
        if "location" in filters:
            rows = [row for row in rows if row[1] in filters["location"]]
        return {
            "id": self.region,
            "region": self.region,
            "instanceTypes": [row[0] for row in rows],
            "locations": [row[1] for row in rows],
            "locationTypes": [location_type for _ in rows],
        }

    def _service_quota(self, args: dict) -> dict:
        code = args.get("quotaCode")
        if args.get("serviceCode") != "ec2" or code not in QUOTAS:
            raise AwsApiError(
                "Service Quotas: GetServiceQuota",
                "NoSuchResourceException",
                f"The request failed because the specified service quota {code} does not exist.",
            )
        name, default = QUOTAS[code]
        value = (self.quotas or {}).get(code, default)
        return {
            "id": f"ec2/{code}",
            "arn": f"arn:aws:servicequotas:{self.region}:{ACCOUNT_ID}:ec2/{code}",
            "adjustable": True,
            "defaultValue": 5.0,
            "globalQuota": False,
            "quotaCode": code,
            "quotaName": name,
            "region": self.region,
            "serviceCode": "ec2",
            "serviceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "value": value,
            "usageMetrics": [],
        }

    def _availability_zones(self, args: dict) -> dict:
        zones = [(name, zone_id, "availability-zone") for name, zone_id in ZONE_IDS[self.region].items()]
        filters = {item["name"]: item["values"] for item in args.get("filters") or []}
        columns = {"zone-name": 0, "zone-id": 1, "zone-type": 2}
        unknown = set(filters) - set(columns) - {"opt-in-status"}
        if unknown:
            raise NotImplementedError(f"FakeAws does not filter zones by {sorted(unknown)}")
        for name, values in filters.items():
            if name == "opt-in-status":
                zones = [zone for zone in zones if "opt-in-not-required" in values]
            else:
                zones = [zone for zone in zones if zone[columns[name]] in values]
        zones = [
            zone
            for zone in zones
            if zone[0] not in (args.get("excludeNames") or [])
            and zone[1] not in (args.get("excludeZoneIds") or [])
        ]
        return {
            "id": self.region,
            "region": self.region,
            "state": args.get("state"),
            "names": [zone[0] for zone in zones],
            "zoneIds": [zone[1] for zone in zones],
            "groupNames": [self.region for _ in zones],
        }

    def _cloudcontrol_resource(self, args: dict) -> dict:
        """Cloud Control's view of a capacity reservation: its CloudFormation properties as JSON text."""
        type_name, identifier = args["typeName"], args["identifier"]
        if type_name != "AWS::EC2::CapacityReservation":
            raise NotImplementedError(f"FakeAws does not read {type_name} through Cloud Control")
        reservation = (self.reservations or {}).get(identifier)
        if reservation is None:
            # Cloud Control answers ResourceNotFoundException; the provider's data source turns it into a
            # not-found error and reports only "couldn't find resource" (terraform-provider-aws
            # internal/service/cloudcontrol: findResource returns retry.NotFoundError, whose Error() is
            # that text; the data source prefixes "reading Cloud Control API (<type>) Resource (<id>)").
            raise self._missing(f"Cloud Control API ({type_name}) Resource", identifier)
        properties = {
            _RESERVATION_PROPERTIES[key]: value
            for key, value in reservation.items()
            if key in _RESERVATION_PROPERTIES and value is not None
        }
        properties.update(Id=identifier, TotalInstanceCount=reservation["instanceCount"])
        return {
            "id": identifier,
            "identifier": identifier,
            "typeName": type_name,
            "region": self.region,
            "properties": json.dumps(properties),
        }

    def _instances(self, args: dict) -> dict:
        """`ec2:DescribeInstances` behind `aws.ec2.get_instances`: every filter must match.

        Filter names as the EC2 API reference lists them for DescribeInstances:
        `capacity-reservation-id`, `instance-state-name` and `tag:<key>`. No match is an empty
        answer, not an error: the provider's `aws_instances` data source returns empty lists since
        terraform-provider-aws v4 (hashicorp/terraform-provider-aws#21219).
        """
        filters = {item["name"]: item["values"] for item in args.get("filters") or []}
        if args.get("instanceStateNames"):
            filters["instance-state-name"] = args["instanceStateNames"]
        for key, value in (args.get("instanceTags") or {}).items():
            filters[f"tag:{key}"] = [value]

        def field_of(instance: dict, name: str) -> str | None:
            if name.startswith("tag:"):
                return instance["tags"].get(name[4:])
            columns = {"capacity-reservation-id": "capacityReservationId", "instance-state-name": "state"}
            if name not in columns:
                raise NotImplementedError(f"FakeAws does not filter instances by {name}")
            return instance.get(columns[name])

        ids = [
            instance["id"]
            for instance in self.instances
            if all(field_of(instance, name) in values for name, values in filters.items())
        ]
        return {
            "id": self.region,
            "region": self.region,
            "ids": ids,
            "privateIps": ["10.0.0.1" for _ in ids],
            "publicIps": [],
            "ipv6Addresses": [],
        }

    def _product(self, args: dict) -> dict:
        """`pricing:GetProducts` behind `aws.pricing.get_product`: its filters are TERM_MATCH on product
        attributes, every one of which a product must hold (Price List API reference, `Filter`), and
        the data source fails unless exactly one product matches (terraform-provider-aws
        internal/service/pricing/product_data_source.go: "did not return any elements", "not precise
        enough"); its `result` is the one PriceList item. The products: each type of `LIST_PRICES`
        as a Linux On-Demand product, and those of `CAPACITY_BLOCK_TYPES` as a Capacity Block one too."""
        if args.get("serviceCode") != "AmazonEC2":
            raise NotImplementedError(f"FakeAws prices EC2 instances only, not {args}")
        filters = {item["field"]: item["value"] for item in args.get("filters") or []}
        instance_type, region = filters.get("instanceType", ""), filters.get("regionCode", "")
        usd = LIST_PRICES.get(instance_type)
        markets = ["OnDemand", "CapacityBlock"] if instance_type in CAPACITY_BLOCK_TYPES else ["OnDemand"]
        items = [price_list_item(instance_type, region, usd, market) for market in markets] if usd else []
        found = [
            item
            for item in items
            if all(
                json.loads(item)["product"]["attributes"].get(key) == value for key, value in filters.items()
            )
        ]
        if not found:
            raise AwsApiError(
                "Pricing: GetProducts", "NotFound", "Pricing product query did not return any elements"
            )
        if len(found) > 1:
            raise AwsApiError(
                "Pricing: GetProducts",
                "NotFound",
                f"Pricing product query not precise enough. Returned more than one element: {found}",
            )
        return {"id": "AmazonEC2", "serviceCode": "AmazonEC2", "filters": args["filters"], "result": found[0]}

    def _missing(self, what: str, name: str) -> AwsApiError:
        """How the AWS provider's data sources report an object that does not exist."""
        return AwsApiError(f"reading {what} ({name})", "NotFound", "couldn't find resource")

    def _cluster(self, args: dict) -> dict:
        name = args["name"]
        if name not in self.clusters:
            raise self._missing("EKS Cluster", name)
        cluster = self.clusters[name]
        return {
            "id": name,
            "name": name,
            "version": cluster["version"],
            # As EKS names it: an id of 32 hex digits, the region (DescribeCluster, `endpoint`).
            "endpoint": f"https://0123456789ABCDEF0123456789ABCDEF.gr7.{self.region}.eks.amazonaws.com",
            "vpcConfig": {"vpcId": cluster["vpcId"], "subnetIds": list(cluster["subnetIds"])},
        }

    def _node_groups(self, args: dict) -> dict:
        cluster = args["clusterName"]
        return {"id": cluster, "clusterName": cluster, "names": sorted(self.node_groups.get(cluster, {}))}

    def _node_group(self, args: dict) -> dict:
        # DescribeNodegroup as pulumi-aws's `aws_eks_node_group` data source flattens it: `status`,
        # and `scalingConfigs`, a list of the one scaling config (no health issues: the data source
        # has none).
        group = self.node_groups[args["clusterName"]][args["nodeGroupName"]]
        return {
            **args,
            "id": args["nodeGroupName"],
            "labels": dict(group["labels"]),
            "subnetIds": list(group["subnetIds"]),
            "status": group.get("status", "ACTIVE"),
            "scalingConfigs": [dict(group["scalingConfig"])] if "scalingConfig" in group else [],
        }

    def _vpc(self, args: dict) -> dict:
        return {"id": args["id"], "cidrBlock": self.vpcs[args["id"]]}

    def _subnet(self, args: dict) -> dict:
        return {"id": args["id"], "availabilityZone": self.subnets[args["id"]]}

    def _log_group(self, args: dict) -> dict:
        if args["name"] not in self.log_groups:
            raise self._missing("CloudWatch Logs Log Group", args["name"])
        return {"id": args["name"], "name": args["name"], "tags": dict(self.log_groups[args["name"]])}

    def _addon(self, args: dict) -> dict:
        # EKS API reference, DescribeAddon: the add-on with its `addonVersion`, or
        # ResourceNotFoundException, which the provider's `aws_eks_addon` data source reports as
        # "couldn't find resource" (terraform-provider-aws internal/service/eks/addon.go).
        cluster, name = args["clusterName"], args["addonName"]
        if name not in self.addons.get(cluster, {}):
            raise self._missing("EKS Add-On", f"{cluster},{name}")
        version = self.addons[cluster][name]
        return {"id": f"{cluster}:{name}", **args, "addonVersion": version, "region": self.region}

    def _addon_version(self, args: dict) -> dict:
        # EKS API reference, DescribeAddonVersions: the builds compatible with the Kubernetes version;
        # `most_recent = true` returns the newest.
        versions = self.addon_builds.get(args["addonName"], {})
        if args["kubernetesVersion"] not in versions:
            raise AwsApiError(
                "EKS: DescribeAddonVersions",
                "NotFound",
                f"no {args['addonName']} for {args['kubernetesVersion']}",
            )
        version = versions[args["kubernetesVersion"]]
        return {**args, "id": args["addonName"], "version": version, "region": self.region}

    def _cluster_versions(self, args: dict) -> dict:
        return {
            "clusterVersions": [
                {
                    "clusterType": "eks",
                    "clusterVersion": version,
                    "versionStatus": status,
                    "defaultVersion": version == "1.36",
                    "defaultPlatformVersion": "eks.1",
                    "kubernetesPatchVersion": f"{version}.0",
                    "releaseDate": "",
                    "endOfStandardSupportDate": "",
                    "endOfExtendedSupportDate": "",
                    "controlPlaneComponentConfigs": [],
                    "controlPlaneScalingTiers": [],
                }
                for version, status in EKS_VERSIONS.items()
            ]
        }

    def _caller_identity(self, args: dict) -> dict:
        return {
            "id": ACCOUNT_ID,
            "accountId": ACCOUNT_ID,
            "arn": f"arn:aws:iam::{ACCOUNT_ID}:user/tester",
            "userId": "AIDAEXAMPLEUSERID0000",
        }

    def _partition(self, args: dict) -> dict:
        return {
            "id": "aws",
            "partition": "aws",
            "dnsSuffix": "amazonaws.com",
            "reverseDnsPrefix": "com.amazonaws",
        }

    def _region(self, args: dict) -> dict:
        return {
            "id": self.region,
            "name": self.region,
            "region": self.region,
            "endpoint": f"ec2.{self.region}.amazonaws.com",
            "description": REGION_DESCRIPTIONS.get(self.region, self.region),
        }


class EngineError(grpc.RpcError):
    """What the Pulumi engine sends back when a provider fails: the SDK turns it into the caller's exception."""

    def __init__(self, details: str):
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details


class FakeAwsMocks(pulumi.runtime.Mocks):
    """Pulumi mocks backed by a `FakeAws`: invokes go to `FakeAws.call`.

    A plain exception raised in `Mocks.call` would be recorded by the SDK as an unhandled RPC
    failure and fail the program even when the caller catches it; an `EngineError` reaches the
    caller as an ordinary exception, as a provider error does under the real engine.
    """

    def __init__(self, aws: FakeAws):
        self.aws = aws

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if (
            args.token == "aws:pricing/getProduct:getProduct"
            and not args.provider
            and self.aws.region not in PRICE_LIST_REGIONS
        ):
            # The stack's own provider asks the Price List endpoint of its region, which does not exist.
            raise EngineError(
                f"invocation of {args.token} returned an error: operation error Pricing: GetProducts, "
                f"https response error: dial tcp: lookup api.pricing.{self.aws.region}.amazonaws.com: no such host"
            )
        try:
            return self.aws.call(args.token, args.args)
        except AwsApiError as err:
            raise EngineError(f"invocation of {args.token} returned an error: {err}") from err

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        return f"{args.name}_id", dict(args.inputs)
