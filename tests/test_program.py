"""The whole Pulumi program under Pulumi's mocks, once per stack file: the plan it would show."""

from __future__ import annotations

import pulumi
import pytest

from tests.fake_aws import FakeAws
from tests.program import STACK_FILES, USER_SETTINGS, Plan, run_program, stack_config

COMPONENTS = {
    "eks-ray-train:infra:Network",
    "eks-ray-train:infra:Cluster",
    "eks-ray-train:infra:SystemNodeGroup",
    "eks-ray-train:infra:GpuNodeGroup",
    "eks-ray-train:infra:CheckpointStore",
    "eks-ray-train:workloads:Addons",
    "eks-ray-train:workloads:RayCluster",
}
TRAINING_RUN = "pulumi-python:dynamic/workloads:TrainingRun"


def config_of(stack_file, **overrides) -> dict[str, str]:
    return {
        **stack_config(stack_file),
        **USER_SETTINGS,
        **{f"eks-ray-train:{k}": v for k, v in overrides.items()},
    }


def dev_config(**overrides) -> dict[str, str]:
    return config_of(next(f for f in STACK_FILES if f.name == "Pulumi.dev.yaml"), **overrides)


@pytest.fixture(scope="module", params=STACK_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def stack_plan(request) -> tuple[dict, Plan]:
    config = config_of(request.param)
    return config, run_program(
        config, FakeAws(region=config["aws:region"]), stack=request.param.stem.split(".", 1)[1]
    )


def test_every_stack_file_is_complete_for_its_region(stack_plan):
    config, plan = stack_plan
    assert {r.type for r in plan.resources} >= COMPONENTS
    region = config["aws:region"]
    subnets = [r for r in plan.of_type("aws:ec2/subnet:Subnet") if "private" in r.name]
    zones = [s.inputs["availabilityZone"] for s in subnets]
    assert len(zones) == 2 and len(set(zones)) == 2 and all(z.startswith(region) for z in zones)


def test_cluster_settings(stack_plan):
    config, plan = stack_plan
    cluster = plan.one("eks:index:Cluster").inputs
    assert cluster["authenticationMode"] == "API"
    assert cluster["skipDefaultNodeGroup"] is True
    assert cluster["endpointPrivateAccess"] is True
    assert cluster["publicAccessCidrs"] == ["203.0.113.7/32"]
    assert cluster["encryptionConfigKeyArn"]
    assert cluster["createOidcProvider"] is True
    assert set(cluster["enabledClusterLogTypes"]) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    assert cluster["version"] == "1.36"
    assert cluster["nodeAssociatePublicIpAddress"] is False
    assert plan.one("aws:kms/key:Key").inputs["enableKeyRotation"] is True
    addons = {r.inputs["addonName"] for r in plan.of_type("aws:eks/addon:Addon")}
    assert addons == {"coredns"}


def test_network_has_nat_and_private_nodes(stack_plan):
    _, plan = stack_plan
    assert len(plan.of_type("aws:ec2/natGateway:NatGateway")) == 1
    for subnet in plan.of_type("aws:ec2/subnet:Subnet"):
        assert subnet.inputs["mapPublicIpOnLaunch"] is False
        role_tag = "kubernetes.io/role/internal-elb" if "private" in subnet.name else "kubernetes.io/role/elb"
        assert subnet.inputs["tags"][role_tag] == "1"
    private_routes = next(
        r for r in plan.of_type("aws:ec2/routeTable:RouteTable") if r.name.endswith("-private")
    )
    assert "natGatewayId" in private_routes.inputs["routes"][0]


def gpu_group(plan: Plan):
    return next(
        r
        for r in plan.of_type("aws:eks/nodeGroup:NodeGroup")
        if r.inputs["labels"].get("role") == "gpu-worker"
    )


def test_gpu_node_group_is_one_subnet_in_the_gpu_az(stack_plan):
    config, plan = stack_plan
    group = gpu_group(plan).inputs
    assert len(group["subnetIds"]) == 1
    gpu_subnet = plan.one("aws:ec2/subnet:Subnet", f"{config['eks-ray-train:clusterName']}-private-0")
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
    assert template["placement"]["groupName"] == "gpu"
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
    assert len(group.inputs["subnetIds"]) == 2
    assert "taints" not in group.inputs


def test_helm_releases_are_pinned(stack_plan):
    _, plan = stack_plan
    releases = {r.inputs["chart"]: r.inputs for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert {chart: values["version"] for chart, values in releases.items()} == {
        "nvidia-device-plugin": "0.20.0",
        "aws-efa-k8s-device-plugin": "v0.5.30",
        "kuberay-operator": "1.7.0",
    }
    assert releases["nvidia-device-plugin"]["values"]["mofedEnabled"] is False


def test_ray_cluster_waits_for_operator_and_both_device_plugins(stack_plan):
    _, plan = stack_plan
    ray_cluster = plan.one("kubernetes:ray.io/v1:RayCluster")
    release_urns = {r.urn for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert len(release_urns) == 3 and release_urns <= set(ray_cluster.dependencies)
    worker = ray_cluster.inputs["spec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == 2 and worker["rayStartParams"]["num-gpus"] == "4"
    assert ray_cluster.inputs["spec"]["rayVersion"] == "2.58.0"


def test_every_resource_sits_under_a_component(stack_plan):
    _, plan = stack_plan
    for registration in plan.resources:
        if registration.type in COMPONENTS | {TRAINING_RUN}:
            continue
        assert set(plan.ancestors(registration)) & COMPONENTS, (
            f"{registration.type} {registration.name} has no component"
        )


def test_kubeconfig_is_secret(stack_plan):
    _, plan = stack_plan
    provider = plan.one("pulumi:providers:kubernetes")
    assert "kubeconfig" in provider.secret_inputs


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
    gpu_subnet = next(r for r in plan.of_type("aws:ec2/subnet:Subnet") if r.name.endswith("private-0"))
    assert gpu_subnet.inputs["availabilityZone"] == "us-east-2b"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gpuNodeType": "g9.unknown"}, "g9.unknown is not offered in any zone of us-east-2"),
        ({"gpuNodeType": "g6.xlarge"}, "does not support EFA"),
        ({"gpuNodeCount": "0"}, "'gpuNodeCount' = '0': must be at least 1"),
        ({"workerCpu": "64"}, "'workerCpu' = 64 does not fit a g6.12xlarge node"),
        ({"gpuAz": "us-west-2a"}, "'gpuAz' = 'us-west-2a' is not in region us-east-2"),
        ({"gpuNodeCont": "2"}, "did you mean 'gpuNodeCount'"),
    ],
)
def test_bad_config_stops_the_program_before_any_resource(overrides, message):
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(**overrides), FakeAws(region="us-east-2"))
    assert message in str(raised.value)
    assert raised.value.plan.resources == []


def test_destroy_order_follows_explicit_dependencies(stack_plan):
    """Pulumi deletes dependents first: RayCluster before the operator, node groups before the cluster."""
    _, plan = stack_plan
    cluster = plan.one("eks:index:Cluster").urn
    policies = {r.urn for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert cluster in group.dependencies, group.name
        assert policies <= set(group.dependencies), group.name
    node_groups = {r.urn for r in plan.of_type("aws:eks/nodeGroup:NodeGroup")}
    for release in plan.of_type("kubernetes:helm.sh/v3:Release"):
        assert node_groups <= set(release.dependencies), release.name
    coredns = plan.one("aws:eks/addon:Addon")
    assert cluster in coredns.dependencies
    provider = plan.one("pulumi:providers:kubernetes")
    assert cluster in provider.dependencies


def test_training_run_follows_the_ray_cluster_and_carries_no_credentials(stack_plan):
    config, plan = stack_plan
    run = plan.one(TRAINING_RUN)
    assert plan.one("kubernetes:ray.io/v1:RayCluster").urn in run.dependencies
    args = run.inputs["job_args"]
    storage = args[args.index("--storage-path") + 1]
    assert storage.startswith("s3://") and storage.endswith("-ckpt/runs")
    assert args[args.index("--workers") + 1] == "8"
    assert run.inputs["expect_transport"] == "efa"
    assert run.inputs["benchmark"] == (config.get("eks-ray-train:benchmark") == "true")
    text = repr(run.inputs).lower()
    for secret_word in ("kubeconfig", "token", "password", "certificate-authority", "secret"):
        assert secret_word not in text


def test_no_training_run_when_train_is_off():
    plan = run_program(dev_config(train="false"), FakeAws(region="us-east-2"))
    assert plan.of_type(TRAINING_RUN) == []


def test_too_many_workers_fails_in_preview():
    with pytest.raises(pulumi.RunError, match="'training.workers' = 9"):
        run_program(dev_config(training='{"workers": 9}'), FakeAws(region="us-east-2"))


def test_hugging_face_token_stays_secret():
    token = "hf_do_not_leak_4f2a"
    plan = run_program(
        dev_config(hfToken=token), FakeAws(region="us-east-2"), secret_keys=["eks-ray-train:hfToken"]
    )
    secret = plan.one("kubernetes:core/v1:Secret")
    assert "stringData" in secret.secret_inputs
    for registration in plan.resources:
        plain = {k: v for k, v in registration.inputs.items() if k not in registration.secret_inputs}
        assert token not in repr(plain), (
            f"{registration.type} {registration.name} holds the token in plain text"
        )
    ray_cluster = plan.one("kubernetes:ray.io/v1:RayCluster")
    assert secret.urn in ray_cluster.dependencies


@pytest.mark.parametrize(
    "region, message",
    [
        ("moon-1", "'aws:region' = 'moon-1': expected a region name"),
        ("us-east-9", "'aws:region' = 'us-east-9'"),
    ],
)
def test_unknown_region_stops_the_preview(region, message):
    config = {**dev_config(), "aws:region": region}
    with pytest.raises(pulumi.RunError, match=message) as raised:
        run_program(config, FakeAws(region=region))
    assert raised.value.plan.resources == []


def test_least_privilege_for_nodes_and_checkpoints(stack_plan):
    """Nodes get only the AWS-managed node policies; only the Ray pods' service account reaches the bucket."""
    import json

    config, plan = stack_plan
    attached = {
        r.inputs["policyArn"] for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert attached == {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
        "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    }
    block = plan.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(
        block[key] is True
        for key in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    encryption = plan.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    )
    assert encryption.inputs["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    pod_role = plan.one("aws:iam/role:Role", "checkpoints-ray-pods")
    statement = json.loads(pod_role.inputs["assumeRolePolicy"])["Statement"]
    assert len(statement) == 1 and statement[0]["Action"] == "sts:AssumeRoleWithWebIdentity"
    subjects = [v for k, v in statement[0]["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    assert subjects == [
        f"system:serviceaccount:{config.get('eks-ray-train:namespace', 'ray-train')}:ray-train"
    ]
    bucket_policy = json.loads(plan.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    resources = {
        r
        for s in bucket_policy["Statement"]
        for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
    }
    bucket = plan.one("aws:s3/bucket:Bucket").inputs["bucket"]
    assert all(bucket in resource for resource in resources)
    service_account = plan.one("kubernetes:core/v1:ServiceAccount").inputs
    assert service_account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]


@pytest.mark.slow
def test_the_program_needs_neither_torch_nor_ray():
    """`pulumi up` installs requirements.txt only: the program must not import the training stack."""
    import subprocess
    import sys

    from tests.program import ROOT

    requirements = (ROOT / "requirements.txt").read_text().lower()
    for package in ("torch", "ray", "transformers"):
        assert not any(line.strip().startswith(package) for line in requirements.splitlines()), package
    script = (
        "import sys\n"
        "from tests.fake_aws import FakeAws\n"
        "from tests.program import STACK_FILES, USER_SETTINGS, run_program, stack_config\n"
        "config = {**stack_config(STACK_FILES[0]), **USER_SETTINGS}\n"
        "run_program(config, FakeAws(region=config['aws:region']))\n"
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
