"""What a later `pulumi up` may change of what already runs under the stack's names in AWS, judged
from what the preview read of it (`infra.preflight.reads.live_stack`).

AWS keeps some choices for a cluster's life, and Pulumi's plan alone cannot tell: EKS never moves
a cluster to another VPC, accepts new subnets only in the zones it was created with ("subnets must
be in the same set of AZs as originally provided"), and upgrades the control plane one minor
version at a time, never down (EKS user guide, "Update existing cluster to new Kubernetes
version"). So the preview reads the cluster of `clusterName`, if there is one, and the program keeps
its zones instead of choosing them anew from today's offerings; a change AWS would refuse after the
VPC and NAT are updated is refused here, naming the key.

The same read gives the versions of the cluster's managed add-ons the program pins, CoreDNS and
CloudWatch Observability (`eks:DescribeAddon`), which it keeps while the cluster stays at its
Kubernetes version (`infra.resources.cluster.addon_version`).

The same read gives the GPU node group's state (`eks:DescribeNodegroup`): a DEGRADED group is
reported at preview with the fix (`gpu_group_warning`). The provider's data source carries the
status and the scaling config, not the health issues, so the warning gives the command that prints
them; the TrainingRun, which reads the group through the EKS API itself, names them.

With the public API endpoint off (`endpointPublicAccess: false`), the same read says whether this
machine reaches the private one, which every `pulumi up` and training run call
(`private_endpoint_problem`).

A read that fails with anything but NotFound leaves the preview unable to tell a live cluster from
none; `unread_cause` says whether AWS denied or throttled it, for the refusal's fix.

A control-plane log group without this program's tag (`OWNER_TAG`), while no cluster exists, was
left by a destroyed cluster: EKS writes its last logs after the program deleted the group, which
re-creates it (terraform-aws-eks#2763), and the next CreateLogGroup fails with
ResourceAlreadyExistsException.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infra.aws_rules.container_insights import ADDON_NAME as OBSERVABILITY_ADDON
from infra.aws_rules.node_repair import ADDON_NAME as NODE_MONITORING_ADDON

# The tag the program puts on the control-plane log group, naming the stack that owns it.
OWNER_TAG = "eks-ray-train:stack"
# The managed add-ons pulumi-eks makes: kube-proxy inside its cluster, vpc-cni in its `VpcCniAddon`.
VPC_CNI_ADDON = "vpc-cni"
KUBE_PROXY_ADDON = "kube-proxy"
# The managed add-ons whose versions the program keeps (`infra.resources.cluster.addon_version`).
PINNED_ADDONS = ("coredns", VPC_CNI_ADDON, KUBE_PROXY_ADDON, OBSERVABILITY_ADDON, NODE_MONITORING_ADDON)


def control_plane_log_group(cluster_name: str) -> str:
    """The log group EKS writes control-plane logs to (EKS user guide, "Send control plane logs to CloudWatch")."""
    return f"/aws/eks/{cluster_name}/cluster"


@dataclass(frozen=True)
class LiveNodeGroup:
    """The cluster's GPU node group as EKS reports it."""

    name: str
    zone: str | None  # the zone of its subnet
    status: str  # CREATING, ACTIVE, UPDATING, DELETING, CREATE_FAILED, DELETE_FAILED or DEGRADED
    desired_size: int


@dataclass(frozen=True)
class LiveCluster:
    """The EKS cluster of `clusterName` as AWS reports it."""

    version: str
    vpc_cidr: str
    zones: tuple[str, ...]  # the zones of its subnets, sorted
    endpoint: str  # the URL of its Kubernetes API (`https://<id>.<suffix>.<region>.eks.amazonaws.com`)
    gpu_group: LiveNodeGroup | None  # its GPU node group, if it exists
    # The version of each of its PINNED_ADDONS it runs (an add-on it lacks is left out).
    addon_versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_zone(self) -> str | None:
        """The zone of its GPU node group's subnet, if the group exists."""
        return self.gpu_group.zone if self.gpu_group else None


# Error codes of a refused call (AWS's common errors: AccessDeniedException; EC2's
# UnauthorizedOperation) and of a throttled one (ThrottlingException; EC2's RequestLimitExceeded;
# TooManyRequestsException), as the provider's error text carries them.
DENIED_CODES = ("AccessDenied", "UnauthorizedOperation", "not authorized")
THROTTLED_CODES = ("Throttling", "RequestLimitExceeded", "TooManyRequests", "Rate exceeded")


def unread_cause(error: str) -> str:
    """Why a read failed, from AWS's answer: "denied", "throttled", or "failed" for anything else."""
    if any(code in error for code in THROTTLED_CODES):
        return "throttled"
    if any(code in error for code in DENIED_CODES):
        return "denied"
    return "failed"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def version_change_problem(live: str, wanted: str) -> str | None:
    """Why EKS will not take the control plane from `live` to `wanted`."""
    (live_major, live_minor), (major, minor) = _minor(live), _minor(wanted)
    if (major, minor) < (live_major, live_minor):
        return f"the cluster runs {live}, and EKS never downgrades a control plane: set {live} back"
    if major == live_major and minor > live_minor + 1:
        return (
            f"the cluster runs {live}, and EKS upgrades one minor version at a time: set "
            f"{live_major}.{live_minor + 1}, run `pulumi up`, then go on"
        )
    return None


def vpc_change_problem(live: LiveCluster, vpc_cidr: str) -> str | None:
    if live.vpc_cidr != vpc_cidr:
        return (
            f"the cluster runs in a VPC of {live.vpc_cidr}, and EKS keeps a cluster's VPC for life: set vpcCidr back "
            f"to {live.vpc_cidr}, or `pulumi destroy` first"
        )
    return None


def addresses_in_vpc(addresses: Sequence[str], live: LiveCluster) -> list[str]:
    """The addresses within the cluster's VPC block (an IPv6 address never is)."""
    vpc = ipaddress.ip_network(live.vpc_cidr)
    return [address for address in addresses if ipaddress.ip_address(address.split("%", 1)[0]) in vpc]


def private_endpoint_problem(
    live: LiveCluster | None, host: str, addresses: Sequence[str], accepted: Sequence[str]
) -> str | None:
    """Why this machine could not call the cluster's Kubernetes API with the public endpoint off.

    A private endpoint answers only inside the cluster's VPC or a network connected to it ("Cluster
    API server endpoint", EKS user guide): there the endpoint's name resolves to addresses in the VPC
    (EKS's private hosted zone, which the VPC's DNS answers from; a connected network needs a Route 53
    Resolver inbound endpoint), and the cluster security group must admit the caller on 443.
    `addresses`: what `host` resolves to on this machine; `accepted`: those of them, in the VPC, that
    accepted a connection. A stack not yet deployed has no VPC anything could be in.
    """
    if live is None:
        return (
            "no cluster of clusterName runs yet, and the VPC its private endpoint will be in does not exist, so "
            "this machine is not in it: create the stack with endpointPublicAccess true (your address in "
            "endpointPublicAccessCidrs), connect this machine to the VPC, then set it to false"
        )
    if not addresses:
        return f"the cluster's endpoint {host} does not resolve on this machine"
    inside = addresses_in_vpc(addresses, live)
    if not inside:
        return (
            f"this machine resolves the cluster's endpoint {host} to {', '.join(addresses)}, outside the "
            f"cluster's VPC ({live.vpc_cidr}): it is outside that VPC, or its DNS does not answer for it (a "
            "connected network needs a Route 53 Resolver inbound endpoint in the VPC)"
        )
    if not accepted:
        return (
            f"the cluster's endpoint {host} resolves to {', '.join(inside)} in its VPC, but none accepted a "
            "connection on port 443 from this machine: the cluster security group (`aws eks describe-cluster "
            "--query cluster.resourcesVpcConfig.clusterSecurityGroupId`) must admit it on 443"
        )
    return None


def gpu_group_warning(cluster: str, region: str, group: LiveNodeGroup, node_count: int) -> str | None:
    """What the preview says of a GPU node group EKS reports DEGRADED: the cause, and the fix.

    A warning, not a refusal: a `pulumi up` without a run leaves the group as it is and succeeds, and
    a run that needs the nodes is refused by the TrainingRun in one line. EKS keeps a managed node
    group DEGRADED, even at 0 nodes, until a scale-out succeeds (aws/containers-roadmap#2326)."""
    if group.status != "DEGRADED":
        return None
    describe = (
        f"aws eks describe-nodegroup --cluster-name {cluster} --nodegroup-name {group.name} --region {region}"
    )
    return (
        f"GPU node group {group.name} is DEGRADED at {group.desired_size} of {node_count} nodes: EC2 could not launch "
        f"or EKS could not keep its nodes; `{describe} --query nodegroup.health.issues` names the cause (for a group "
        "scaled to 0, its last scale-out failed: no capacity, a quota, no free addresses). Fix that cause, then "
        f"`aws eks update-nodegroup-config --cluster-name {cluster} --nodegroup-name {group.name} --scaling-config "
        f"desiredSize={node_count} --region {region}`: EKS makes it ACTIVE again once that scale-out succeeds. Until "
        "then a training run cannot get its GPU nodes"
    )
