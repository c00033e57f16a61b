"""What already runs under the stack's names, read through the AWS provider's data sources in a mocked
preview (tests/harness/fake_aws.py): none, a live cluster with its zones, GPU group and add-ons, a
read that must succeed and fails, a log group a destroyed cluster left."""

from __future__ import annotations

import pytest

from infra.aws_rules.live_stack import OWNER_TAG, LiveNodeGroup
from infra.preflight.reads.live_stack import (
    UnreadLiveStack,
    _must_read,
    orphaned_log_group,
    read_live_cluster,
)
from platform_contract import GPU_LABELS
from tests.harness.fake_aws import FakeAws
from tests.harness.preflight_run import read_in_preview

LOG_GROUP = "/aws/eks/c/cluster"


def live_account() -> FakeAws:
    """An account running cluster `c` in two zones of 10.0.0.0/16, its GPU group degraded at 0 nodes."""
    return FakeAws(
        region="us-west-2",
        clusters={"c": {"version": "1.31", "vpcId": "vpc-1", "subnetIds": ["subnet-b", "subnet-a"]}},
        vpcs={"vpc-1": "10.0.0.0/16"},
        subnets={"subnet-a": "us-west-2a", "subnet-b": "us-west-2b"},
        node_groups={
            "c": {
                "system": {"labels": {"role": "system"}, "subnetIds": ["subnet-b"]},
                "gpu-1": {
                    "labels": dict(GPU_LABELS),
                    "subnetIds": ["subnet-a"],
                    "status": "DEGRADED",
                    "scalingConfig": {"desiredSize": 0, "minSize": 0, "maxSize": 2},
                },
            }
        },
        addons={"c": {"coredns": "v1.11.4-eksbuild.2"}},
    )


def test_no_cluster_of_that_name_reads_as_none():
    assert read_in_preview(FakeAws(), lambda: read_live_cluster("c")) is None


def test_a_live_cluster_is_read_with_its_zones_its_gpu_group_and_its_add_ons():
    live = read_in_preview(live_account(), lambda: read_live_cluster("c"))
    assert live is not None
    assert (live.version, live.vpc_cidr, live.zones) == ("1.31", "10.0.0.0/16", ("us-west-2a", "us-west-2b"))
    assert live.gpu_group == LiveNodeGroup(name="gpu-1", zone="us-west-2a", status="DEGRADED", desired_size=0)
    assert live.addon_versions == {"coredns": "v1.11.4-eksbuild.2"}


def test_a_denied_read_the_zones_rest_on_names_its_action():
    fake = live_account()
    fake.denied = {"aws:ec2/getSubnet:getSubnet"}
    with pytest.raises(UnreadLiveStack) as raised:
        read_in_preview(fake, lambda: read_live_cluster("c"))
    assert raised.value.action == "ec2:DescribeSubnets" and "AccessDenied" in raised.value.error


def test_only_a_log_group_without_the_owner_tag_is_left_by_a_destroyed_cluster():
    assert not read_in_preview(FakeAws(), lambda: orphaned_log_group(LOG_GROUP))
    owned = FakeAws(log_groups={LOG_GROUP: {OWNER_TAG: "eks-ray-train/dev"}})
    assert not read_in_preview(owned, lambda: orphaned_log_group(LOG_GROUP))
    assert read_in_preview(FakeAws(log_groups={LOG_GROUP: {}}), lambda: orphaned_log_group(LOG_GROUP))


def test_a_read_that_must_succeed_names_what_it_read_the_action_and_the_errors_first_line():
    def denied() -> None:
        raise RuntimeError("AccessDenied: no\nmore detail")

    with pytest.raises(UnreadLiveStack) as raised:
        _must_read(denied, "the cluster", "eks:DescribeCluster")
    assert (raised.value.what, raised.value.action, raised.value.error) == (
        "the cluster",
        "eks:DescribeCluster",
        "AccessDenied: no",
    )
    assert _must_read(lambda: 3, "a number", "none") == 3
