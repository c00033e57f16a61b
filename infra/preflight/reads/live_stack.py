"""What already runs under the stack's names in AWS, read at preview through the AWS provider's data
sources: the cluster of `clusterName`, its VPC's block, its subnets' zones, its GPU node group
(`eks:DescribeNodegroup` through `aws.eks.get_node_group`) and its pinned add-ons' versions; and
whether a control-plane log group was left by a destroyed cluster. What a later `pulumi up` may
change of them is judged in `infra.aws_rules.live_stack`.

A read of the cluster that fails with anything but NotFound (the identity may not call
`eks:DescribeCluster`, AWS throttled it) leaves the preview unable to tell a live cluster from none,
and previewing it as new would choose its zones, subnets and GPU zone anew, moving a live one's. So
every read the zones rest on raises `UnreadLiveStack` naming its IAM action, where the preflight
refuses (`infra.preflight.live_cluster`). That asks for no permission the stack lacks: creating its
cluster calls DescribeCluster (the `aws.eks.Cluster` resource waits for ACTIVE with it:
terraform-provider-aws internal/service/eks/cluster.go, `waitClusterCreated` over
`findClusterByName`), and so does every training run (`workloads.training_run.provider.connect_to_eks`).
The add-on versions stay a warning: an unread one only takes the newest build.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import pulumi
import pulumi_aws as aws

from infra.aws_rules.live_stack import OWNER_TAG, PINNED_ADDONS, LiveCluster, LiveNodeGroup
from platform_contract import GPU_LABELS

T = TypeVar("T")


class UnreadLiveStack(Exception):
    """A read of what runs under the stack's names failed with something other than NotFound: `what`
    was read, `action` is the IAM action it needs, `error` AWS's answer (its first line)."""

    def __init__(self, what: str, action: str, error: str) -> None:
        super().__init__(f"could not read {what} ({action}): {error}")
        self.what, self.action, self.error = what, action, error


def _not_found(err: Exception) -> bool:
    """The provider words a data source's missing object "couldn't find resource" or NotFound."""
    return "couldn't find resource" in str(err) or "NotFound" in str(err)


def _first_line(err: Exception) -> str:
    text = " ".join(str(err).strip().splitlines()[:1])
    return text or type(err).__name__


def _read(fetch: Callable[[], T], unread: str) -> T | None:
    """`fetch()`, or None when AWS has no such object; another failure is warned: `unread` says what
    goes unchecked."""
    try:
        return fetch()
    except Exception as err:
        if not _not_found(err):
            pulumi.log.warn(f"could not read {unread} ({err})")
        return None


def _must_read(fetch: Callable[[], T], what: str, action: str) -> T:
    """`fetch()`; a failure raises `UnreadLiveStack`."""
    try:
        return fetch()
    except Exception as err:
        raise UnreadLiveStack(what, action, _first_line(err)) from err


def read_live_cluster(cluster_name: str) -> LiveCluster | None:
    """The cluster, its VPC's block, its subnets' zones and its pinned add-ons' versions; None when
    EKS has no cluster of that name. Raises `UnreadLiveStack` when a read the zones rest on fails."""
    try:
        cluster = aws.eks.get_cluster(name=cluster_name)
    except Exception as err:
        if _not_found(err):
            return None
        raise UnreadLiveStack(f"EKS cluster {cluster_name}", "eks:DescribeCluster", _first_line(err)) from err
    vpc_id = cluster.vpc_config.vpc_id
    vpc = _must_read(lambda: aws.ec2.get_vpc(id=vpc_id), f"VPC {vpc_id}", "ec2:DescribeVpcs")
    zones = {_zone(subnet) for subnet in cluster.vpc_config.subnet_ids}
    return LiveCluster(
        version=cluster.version,
        vpc_cidr=vpc.cidr_block,
        zones=tuple(sorted(zones)),
        endpoint=cluster.endpoint,
        gpu_group=_gpu_group(cluster_name),
        addon_versions={
            name: version for name in PINNED_ADDONS if (version := _addon_version(cluster_name, name))
        },
    )


def _zone(subnet_id: str) -> str:
    subnet = _must_read(
        lambda: aws.ec2.get_subnet(id=subnet_id), f"subnet {subnet_id}", "ec2:DescribeSubnets"
    )
    return subnet.availability_zone


def _gpu_group(cluster_name: str) -> LiveNodeGroup | None:
    """The node group carrying the GPU labels (autonamed, so found by its labels)."""
    listed = _must_read(
        lambda: aws.eks.get_node_groups(cluster_name=cluster_name),
        f"the node groups of EKS cluster {cluster_name}",
        "eks:ListNodegroups",
    )
    for name in listed.names:
        group = _must_read(
            functools.partial(aws.eks.get_node_group, cluster_name=cluster_name, node_group_name=name),
            f"node group {name} of EKS cluster {cluster_name}",
            "eks:DescribeNodegroup",
        )
        if GPU_LABELS.items() <= (group.labels or {}).items():
            scaling = group.scaling_configs[0] if group.scaling_configs else None
            return LiveNodeGroup(
                name=name,
                zone=_zone(group.subnet_ids[0]) if group.subnet_ids else None,
                status=group.status,
                desired_size=scaling.desired_size if scaling else 0,
            )
    return None


def _addon_version(cluster_name: str, addon_name: str) -> str | None:
    """The version of the cluster's managed add-on `addon_name` (`eks:DescribeAddon`); None when the
    cluster has no such add-on (ResourceNotFoundException) or it could not be read."""
    addon = _read(
        lambda: aws.eks.get_addon(addon_name=addon_name, cluster_name=cluster_name),
        f"the {addon_name} add-on of EKS cluster {cluster_name}; it takes the newest version EKS offers for "
        "kubernetesVersion, which updates it if a newer one was published",
    )
    return addon.addon_version if addon else None


def orphaned_log_group(name: str) -> bool:
    """The log group exists without this program's tag (call only while no cluster exists)."""
    group = _read(
        lambda: aws.cloudwatch.get_log_group(name=name),
        f"log group {name}; a group left by a destroyed cluster was not looked for",
    )
    return group is not None and OWNER_TAG not in (group.tags or {})
