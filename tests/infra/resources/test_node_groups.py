"""The system and GPU node groups in the program's plan: subnets, launch templates, the reservation\nthey launch into, how they roll and when they wait."""

from __future__ import annotations

import base64
import email
from datetime import timedelta

import yaml

from infra.resources import node_groups
from tests.harness.fake_aws import (
    FakeAws,
    capacity_block,
    capacity_reservation,
)
from tests.harness.preview_queries import (
    GPU_TEMPLATE,
    NODE_GROUP,
    NOW,
    RESERVATION,
    gpu_group,
    subnet_with_id,
)
from tests.harness.program import (
    dev_config,
    run_program,
)
from workloads.training_run.readiness import MIN_MEMLOCK_KIB, HostLimits, host_limit_problems


def test_gpu_node_group_is_one_subnet_in_the_gpu_az(stack_plan):
    config, plan = stack_plan
    group = gpu_group(plan).inputs
    assert len(group["subnetIds"]) == 1
    region = config["aws:region"]
    gpu_subnet = plan.one("aws:ec2/subnet:Subnet", f"{config['eks-ray-train:clusterName']}-private-{region}a")
    assert group["subnetIds"] == [f"{gpu_subnet.name}-id"]
    assert group["amiType"] == "AL2023_x86_64_NVIDIA"
    assert group["instanceTypes"] == ["g6.12xlarge"]
    assert group["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    assert group["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
    assert group["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]


def test_gpu_launch_template_has_efa_placement_and_imdsv2(stack_plan):
    _, plan = stack_plan
    template = plan.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu").inputs
    assert template["metadataOptions"]["httpTokens"] == "required"
    interfaces = template["networkInterfaces"]
    assert len(interfaces) == 1 and interfaces[0]["interfaceType"] == "efa"
    assert interfaces[0]["networkCardIndex"] == 0 and interfaces[0]["deviceIndex"] == 0
    efa_group = plan.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa")
    assert interfaces[0]["securityGroups"] == ["sg-0eksclusterprimary", f"{efa_group.name}-id"]
    assert "vpcSecurityGroupIds" not in template and "subnetId" not in interfaces[0]
    gpu_zone = subnet_with_id(plan, gpu_group(plan).inputs["subnetIds"][0]).inputs["availabilityZone"]
    assert template["placement"]["groupName"] == f"gpu-{gpu_zone}"  # one placement group per zone
    assert plan.one("aws:ec2/placementGroup:PlacementGroup").inputs["strategy"] == "cluster"
    volume = template["blockDeviceMappings"][0]["ebs"]
    assert (volume["volumeSize"], volume["volumeType"], volume["encrypted"]) == (200, "gp3", "true")
    assert "capacityReservationSpecification" not in template
    rules = plan.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    rules += plan.of_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    for rule in rules:
        assert (
            rule.inputs["securityGroupId"]
            == rule.inputs["referencedSecurityGroupId"]
            == f"{efa_group.name}-id"
        )
        assert rule.inputs["ipProtocol"] == "-1"
    assert len(rules) == 2


def test_every_launch_template_requires_imdsv2(stack_plan):
    _, plan = stack_plan
    templates = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == 2
    assert all(t.inputs["metadataOptions"]["httpTokens"] == "required" for t in templates)


def test_system_node_group(stack_plan):
    _, plan = stack_plan
    group = next(
        r for r in plan.of_type("aws:eks/nodeGroup:NodeGroup") if r.inputs["labels"] == {"role": "system"}
    )
    assert group.inputs["instanceTypes"] == ["m7i.xlarge"]
    assert group.inputs["scalingConfig"]["desiredSize"] == 1
    assert len(group.inputs["subnetIds"]) == 3
    assert "taints" not in group.inputs
    # The Ray head's disruption budget refuses its eviction: an update of this group goes on once
    # EKS's drain has failed on it, instead of failing with PodEvictionFailure.
    assert group.inputs["forceUpdateVersion"] is True
    gpu = next(r for r in plan.of_type("aws:eks/nodeGroup:NodeGroup") if r is not group)
    assert "forceUpdateVersion" not in gpu.inputs


def test_capacity_reservation_is_targeted():
    reservation = "cr-0123456789abcdef0"
    fake = FakeAws(region="us-east-2")
    fake.reservations = {
        reservation: {
            "id": reservation,
            "availabilityZone": "us-east-2b",
            "instanceType": "g6.12xlarge",
            "instanceCount": 2,
            "availableInstanceCount": 2,
            "state": "active",
            "instancePlatform": "Linux/UNIX",
            "tenancy": "default",
        }
    }
    plan = run_program(dev_config(capacityReservationId=reservation), fake)
    template = plan.one("aws:ec2/launchTemplate:LaunchTemplate", "gpu").inputs
    target = template["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == reservation
    gpu_subnet = subnet_with_id(plan, gpu_group(plan).inputs["subnetIds"][0])
    assert gpu_subnet.name == "eks-ray-train-private-us-east-2b"
    assert gpu_subnet.inputs["availabilityZone"] == "us-east-2b"


def test_targeted_reservation_gets_no_placement_group_of_its_own():
    """EC2 launches into a targeted reservation only when the placement matches it."""
    fake = FakeAws(region="us-east-2", reservations={RESERVATION: capacity_reservation("us-east-2b")})
    plan = run_program(dev_config(capacityReservationId=RESERVATION), fake)
    assert plan.of_type("aws:ec2/placementGroup:PlacementGroup") == []
    template = plan.one(GPU_TEMPLATE, "gpu").inputs
    assert "placement" not in template
    assert "instanceMarketOptions" not in template and "instanceType" not in template
    group = plan.one(NODE_GROUP, "gpu").inputs
    assert (group["capacityType"], group["instanceTypes"]) == ("ON_DEMAND", ["g6.12xlarge"])


def test_reservation_made_in_a_cluster_placement_group_is_launched_into_that_group():
    arn = "arn:aws:ec2:us-east-2:123456789012:placement-group/gpu-pg"
    reservation = capacity_reservation("us-east-2b", placement_group_arn=arn)
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION), FakeAws(reservations={RESERVATION: reservation})
    )
    assert plan.of_type("aws:ec2/placementGroup:PlacementGroup") == []
    assert plan.one(GPU_TEMPLATE, "gpu").inputs["placement"] == {"groupName": "gpu-pg"}


def test_capacity_block_launches_as_a_capacity_block():
    """EKS user guide, "Create a managed node group with Capacity Blocks for ML"."""
    block = capacity_block("us-east-2b", NOW, timedelta(hours=-1), timedelta(hours=23))
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge"),
        FakeAws(reservations={RESERVATION: block}),
        now=NOW,
    )
    template = plan.one(GPU_TEMPLATE, "gpu").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["instanceType"] == "p5.48xlarge"
    target = template["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == RESERVATION
    group = plan.one(NODE_GROUP, "gpu").inputs
    assert group["capacityType"] == "CAPACITY_BLOCK"
    assert "instanceTypes" not in group  # the instance type is the launch template's
    assert plan.of_type("aws:ec2/placementGroup:PlacementGroup") == []


def test_gpu_group_in_a_reservation_replaces_nodes_before_launching_new_ones():
    fake = FakeAws(region="us-east-2", reservations={RESERVATION: capacity_reservation("us-east-2b")})
    update = run_program(dev_config(capacityReservationId=RESERVATION), fake).one(NODE_GROUP, "gpu").inputs
    assert update["updateConfig"] == {"maxUnavailable": 1, "updateStrategy": "MINIMAL"}


def test_gpu_group_rolls_one_node_at_a_time_without_a_surge(stack_plan):
    """EKS's DEFAULT update launches max(2 x zones, maxUnavailable) nodes first: 2 more GPU nodes
    than the quota the preflight asks for. MINIMAL replaces each node in place (EKS API reference)."""
    _, plan = stack_plan
    assert plan.one(NODE_GROUP, "gpu").inputs["updateConfig"] == {
        "maxUnavailable": 1,
        "updateStrategy": "MINIMAL",
    }
    assert plan.one(NODE_GROUP, "gpu").inputs["capacityType"] == "ON_DEMAND"


def test_a_replaced_gpu_group_is_deleted_before_its_successor_launches(stack_plan):
    """A new gpuAz, gpuNodeType or capacity type replaces the group (EKS node group subnets and
    instance types cannot change in place); created first, the new nodes would need twice the
    quota and a placement group held in another zone (EC2 InvalidPlacementGroup.InUse)."""
    _, plan = stack_plan
    assert plan.one(NODE_GROUP, "gpu").delete_before_replace
    assert not plan.one(NODE_GROUP, "system").delete_before_replace
    group = plan.one("aws:ec2/placementGroup:PlacementGroup")
    assert group.alias_names == ["gpu"]  # stacks deployed with the zone-less name keep their group


def test_a_zone_move_gets_a_placement_group_of_its_own():
    first = run_program(dev_config(), FakeAws(region="us-east-2"))
    moved = run_program(dev_config(gpuAz="us-east-2b"), FakeAws(region="us-east-2"))
    names = [plan.one("aws:ec2/placementGroup:PlacementGroup").name for plan in (first, moved)]
    assert names == ["gpu-us-east-2a", "gpu-us-east-2b"]


def test_node_groups_follow_the_control_plane_version():
    """Managed node groups keep the version they were created with, and EKS refuses the next
    control-plane upgrade while they lag ("Nodegroups must be updated to match cluster version"):
    both take the cluster's applied version, so they update after the control plane. In the update
    phase of `pulumi up` (`preview=False`), where pulumi-eks's `eksCluster` and its version are known."""
    plan = run_program(dev_config(kubernetesVersion="1.35"), FakeAws(region="us-east-2"), preview=False)
    cluster = plan.one("eks:index:Cluster")
    for name in ("system", "gpu"):
        group = plan.one(NODE_GROUP, name)
        assert group.inputs["version"] == cluster.inputs["version"] == "1.35", name
        assert cluster.urn in group.dependencies, name


def test_node_groups_wait_for_the_nat_routes(stack_plan):
    """Nodes pull their images through the NAT gateway; a group created before the private routes
    launches nodes that cannot pull and never join."""
    _, plan = stack_plan
    private_routes = [r for r in plan.of_type("aws:ec2/routeTable:RouteTable") if r.name.endswith("-private")]
    assert len(private_routes) == 1
    needed = {plan.one("aws:ec2/natGateway:NatGateway").urn, private_routes[0].urn}
    needed |= {
        r.urn
        for r in plan.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
        if "-private-" in r.name
    }
    for name in ("system", "gpu"):
        assert needed <= set(plan.one(NODE_GROUP, name).dependencies), name


def test_launch_templates_keep_pods_off_instance_metadata(stack_plan):
    """Hop limit 1: the metadata response does not reach a pod's network namespace."""
    _, plan = stack_plan
    templates = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == 2
    assert all(t.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1 for t in templates)
    ray = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]
    region = stack_plan[0]["aws:region"]
    pods = [ray["headGroupSpec"]["template"], ray["workerGroupSpecs"][0]["template"]]
    for pod in pods:
        assert "hostNetwork" not in pod["spec"]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == region


def test_system_nodes_have_room_for_the_ray_head_image(stack_plan):
    _, plan = stack_plan
    template = plan.one("aws:ec2/launchTemplate:LaunchTemplate", "system").inputs
    assert template["blockDeviceMappings"][0]["ebs"]["volumeSize"] >= 80


def node_configs(user_data: str) -> list[dict]:
    """The NodeConfig documents nodeadm reads from a launch template's user data: base64, then a MIME
    multipart document whose `application/node.eks.aws` parts hold YAML (nodeadm's configprovider)."""
    message = email.message_from_bytes(base64.b64decode(user_data))
    assert message.is_multipart() and message.get_content_type() == "multipart/mixed"
    return [
        yaml.safe_load(part.get_payload())
        for part in message.get_payload()
        if part.get_content_type() == node_groups.NODE_CONFIG_MEDIA_TYPE
    ]


def test_gpu_nodes_set_the_containers_locked_memory_limit_and_system_nodes_are_unchanged(stack_plan):
    """The GPU launch template's user data: one NodeConfig whose containerd base runtime spec sets
    RLIMIT_MEMLOCK, and restates nodeadm's RLIMIT_NOFILE, since a list replaces the default's whole."""
    _, plan = stack_plan
    [config] = node_configs(plan.one(GPU_TEMPLATE, "gpu").inputs["userData"])
    assert (config["apiVersion"], config["kind"]) == ("node.eks.aws/v1alpha1", "NodeConfig")
    # Nothing of the cluster: EKS adds its own part with that to a managed group's user data.
    assert list(config["spec"]) == ["containerd"]
    spec = config["spec"]["containerd"]["baseRuntimeSpec"]
    assert spec == {"process": {"rlimits": spec["process"]["rlimits"]}}  # merged into the default's
    rlimits = {limit["type"]: (limit["soft"], limit["hard"]) for limit in spec["process"]["rlimits"]}
    assert rlimits == {
        "RLIMIT_NOFILE": (65536, 1048576),  # nodeadm's default (base-runtime-spec.json, v20260724)
        "RLIMIT_MEMLOCK": (2**53, 2**53),
    }
    assert "userData" not in plan.one("aws:ec2/launchTemplate:LaunchTemplate", "system").inputs


def test_the_container_rlimits_survive_nodeadms_merge_exactly():
    """nodeadm merges the base runtime spec through Go's `interface{}`, where numbers are float64s
    (nodeadm/internal/util/merge.go): a limit it writes is the float nearest to ours, printed in the
    fewest digits; containerd reads it back as a uint64. "Unlimited" (2^64 - 1) would come out as
    18446744073709552000, past a uint64, and containerd would refuse the whole spec."""
    for limit in node_groups.CONTAINER_RLIMITS:
        for value in (limit["soft"], limit["hard"]):
            assert int(float(value)) == value < 2**64, limit
    unlimited = 2**64 - 1
    assert int(float(unlimited)) > unlimited
    assert repr(float(unlimited)) == "1.8446744073709552e+19"  # Go's encoding/json: 18446744073709552000


def test_readiness_takes_the_gpu_nodes_limit_and_refuses_a_node_without_it():
    """The limit the NodeConfig sets passes readiness (`ulimit -l` prints KiB); a node that did not
    take the config, at the 8 MiB kernels and systemd give by default, is refused."""
    limit_kib = node_groups.CONTAINER_MEMLOCK_BYTES // 1024
    assert limit_kib >= MIN_MEMLOCK_KIB
    assert host_limit_problems("ray-worker-0", HostLimits("580.65.06", "13.0", "12.8", str(limit_kib))) == []
    [problem] = host_limit_problems("ray-worker-0", HostLimits("580.65.06", "13.0", "12.8", "8192"))
    assert "locked-memory limit is 8192 KiB" in problem
