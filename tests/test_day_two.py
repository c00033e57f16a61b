"""A later `pulumi up`: the program runs twice under mocks, the first deploy, then the world after it.

`tests.harness.program.deployed` turns the first run's plan into what AWS then reports (the EKS cluster,
its VPC, subnets, node groups and log group); the second run sees that account, with changed
settings or changed offerings, and must plan what AWS accepts or refuse at preview naming the key.
"""

from __future__ import annotations

import pulumi
import pytest

from infra.aws_facts.live_stack import OWNER_TAG
from tests.harness.fake_aws import FakeAws
from tests.harness.program import deployed, dev_config, run_program

SUBNET = "aws:ec2/subnet:Subnet"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def after_first_deploy(fake: FakeAws, **overrides: str) -> FakeAws:
    return deployed(run_program(dev_config(**overrides), fake), fake)


def refusal(fake: FakeAws, **overrides: str) -> str:
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(**overrides), fake)
    assert raised.value.plan.resources == []
    return str(raised.value)


def test_an_unchanged_second_run_plans_the_same_resources():
    fake = FakeAws(region="us-east-2")
    first = run_program(dev_config(), fake)
    second = run_program(dev_config(), deployed(first, fake))
    assert sorted((r.type, r.name) for r in second.resources) == sorted(
        (r.type, r.name) for r in first.resources
    )


def test_eks_keeps_a_clusters_vpc_for_life():
    fake = after_first_deploy(FakeAws(region="us-east-2"))
    message = refusal(fake, vpcCidr="10.1.0.0/16")
    assert message.startswith(
        "config key 'vpcCidr' = '10.1.0.0/16': the cluster runs in a VPC of 10.0.0.0/16"
    )
    assert "`pulumi destroy` first" in message


@pytest.mark.parametrize(
    ("wanted", "problem"),
    [
        ("1.36", "EKS upgrades one minor version at a time: set 1.35, run `pulumi up`, then go on"),
        ("1.33", "EKS never downgrades a control plane: set 1.34 back"),
    ],
)
def test_eks_upgrades_a_control_plane_one_minor_version_at_a_time(wanted, problem):
    fake = after_first_deploy(FakeAws(region="us-east-2"), kubernetesVersion="1.34")
    assert refusal(fake, kubernetesVersion=wanted) == (
        f"config key 'kubernetesVersion' = '{wanted}': the cluster runs 1.34, and {problem}"
    )
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), fake)
    assert upgraded.one("eks:index:Cluster").inputs["version"] == "1.35"


def test_a_live_cluster_keeps_its_zones_when_aws_adds_an_offering():
    """EKS accepts new subnets only in the zones a cluster was created with; zones chosen anew from
    today's offerings would move the cluster's subnets, and the GPU nodes with them."""
    region = "us-east-1"
    before = {
        "m7i.xlarge": ["us-east-1b", "us-east-1c", "us-east-1d"],
        "g6.12xlarge": ["us-east-1c", "us-east-1d"],
    }
    fake = FakeAws(region=region, offerings=before)
    first = run_program(dev_config(**{"aws:region": region}), fake)
    deployed(first, fake)
    fake.offerings = {name: ["us-east-1a", *zones] for name, zones in before.items()}
    second = run_program(dev_config(**{"aws:region": region}), fake)
    for plan in (first, second):
        zones = {r.inputs["availabilityZone"] for r in plan.of_type(SUBNET) if "-public-" in r.name}
        assert zones == {"us-east-1b", "us-east-1c", "us-east-1d"}
        gpu_subnet = plan.one(NODE_GROUP, "gpu").inputs["subnetIds"][0]
        assert gpu_subnet.endswith("-private-us-east-1c-id")
    fresh = run_program(
        dev_config(**{"aws:region": region}), FakeAws(region=region, offerings=fake.offerings)
    )
    assert fresh.one(NODE_GROUP, "gpu").inputs["subnetIds"][0].endswith("-private-us-east-1a-id")


def test_moving_the_gpu_zone_of_a_live_cluster_is_still_a_setting():
    fake = after_first_deploy(FakeAws(region="us-east-2"))
    moved = run_program(dev_config(gpuAz="us-east-2b"), fake)
    assert moved.one(NODE_GROUP, "gpu").inputs["subnetIds"][0].endswith("-private-us-east-2b-id")


def test_a_log_group_left_by_a_destroyed_cluster_is_named_at_preview():
    """EKS writes its last logs after the program deleted the group, re-creating it without the
    program's tag (terraform-aws-eks#2763); CreateLogGroup would then fail after the VPC exists."""
    fake = FakeAws(region="us-east-2", log_groups={"/aws/eks/eks-ray-train/cluster": {}})
    message = refusal(fake)
    assert message.startswith("config key 'clusterName' = 'eks-ray-train': no cluster of that name runs")
    assert (
        "aws logs delete-log-group --log-group-name /aws/eks/eks-ray-train/cluster --region us-east-2"
        in message
    )


def test_the_stacks_own_log_group_without_a_cluster_is_no_orphan():
    """A first `pulumi up` that failed after the log group and before the cluster: the group is the stack's."""
    fake = FakeAws(
        region="us-east-2", log_groups={"/aws/eks/eks-ray-train/cluster": {OWNER_TAG: "eks-ray-train/dev"}}
    )
    assert run_program(dev_config(), fake).of_type("eks:index:Cluster")
