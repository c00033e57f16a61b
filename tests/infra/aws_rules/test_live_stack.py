"""The live stack's judgements, on a cluster as AWS reports it: what EKS will not change, which
addresses lie in the cluster's VPC, why a private endpoint is out of reach, what a degraded GPU group
needs, why a read failed, and the name of the log group it looks for. (The reads:
tests/infra/preflight/reads/test_live_stack.py; the program's use of them: tests/test_program_day_two.py.)"""

from __future__ import annotations

import pytest

from infra.aws_rules.live_stack import (
    LiveCluster,
    LiveNodeGroup,
    addresses_in_vpc,
    control_plane_log_group,
    gpu_group_warning,
    private_endpoint_problem,
    unread_cause,
    version_change_problem,
    vpc_change_problem,
)

GROUP = LiveNodeGroup(name="gpu", zone="us-west-2a", status="ACTIVE", desired_size=2)
LIVE = LiveCluster(
    version="1.31",
    vpc_cidr="10.0.0.0/16",
    zones=("us-west-2a", "us-west-2b"),
    endpoint="https://abc.gr7.us-west-2.eks.amazonaws.com",
    gpu_group=GROUP,
)


def test_eks_takes_a_control_plane_up_one_minor_version_and_never_down():
    assert version_change_problem("1.31", "1.31") is None
    assert version_change_problem("1.31", "1.32") is None
    assert "one minor version at a time: set 1.32" in version_change_problem("1.31", "1.33")
    assert "never downgrades a control plane: set 1.31 back" in version_change_problem("1.31", "1.30")


def test_a_clusters_vpc_block_cannot_change():
    assert vpc_change_problem(LIVE, "10.0.0.0/16") is None
    assert "set vpcCidr back to 10.0.0.0/16" in vpc_change_problem(LIVE, "10.1.0.0/16")


def test_only_the_addresses_in_the_vpc_block_count_and_an_ipv6_one_never_does():
    assert addresses_in_vpc(["10.0.3.4", "52.1.2.3", "fe80::1%eth0", "10.0.0.9"], LIVE) == [
        "10.0.3.4",
        "10.0.0.9",
    ]


def test_a_private_endpoint_needs_a_cluster_an_address_in_its_vpc_and_one_that_accepts():
    host = "abc.gr7.us-west-2.eks.amazonaws.com"
    assert "create the stack with endpointPublicAccess true" in private_endpoint_problem(None, host, [], [])
    assert "does not resolve on this machine" in private_endpoint_problem(LIVE, host, [], [])
    assert "outside the cluster's VPC (10.0.0.0/16)" in private_endpoint_problem(LIVE, host, ["52.1.2.3"], [])
    assert "none accepted a connection on port 443" in private_endpoint_problem(LIVE, host, ["10.0.3.4"], [])
    assert private_endpoint_problem(LIVE, host, ["10.0.3.4"], ["10.0.3.4"]) is None


def test_only_a_degraded_gpu_group_is_warned_about_with_the_scale_out_that_clears_it():
    assert gpu_group_warning("c", "us-west-2", GROUP, 2) is None
    degraded = LiveNodeGroup(name="gpu", zone="us-west-2a", status="DEGRADED", desired_size=0)
    warning = gpu_group_warning("c", "us-west-2", degraded, 2)
    assert "GPU node group gpu is DEGRADED at 0 of 2 nodes" in warning
    assert "--scaling-config desiredSize=2 --region us-west-2" in warning


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ("AccessDeniedException: User is not authorized to perform eks:DescribeCluster", "denied"),
        ("UnauthorizedOperation: You are not authorized", "denied"),
        ("ThrottlingException: Rate exceeded", "throttled"),
        ("RequestLimitExceeded", "throttled"),
        ("connection reset by peer", "failed"),
    ],
)
def test_a_failed_read_is_denied_throttled_or_failed(error, cause):
    assert unread_cause(error) == cause


def test_eks_writes_control_plane_logs_to_a_group_named_by_the_cluster():
    assert control_plane_log_group("eks-ray-train") == "/aws/eks/eks-ray-train/cluster"
