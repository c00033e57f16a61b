"""The whole Pulumi program under Pulumi's mocks, once per stack file: the plan it would show."""

from __future__ import annotations

import ipaddress
import json
import re
from datetime import UTC, datetime, timedelta

import pulumi
import pytest
from pulumi.output import Unknown

from infra.aws_facts.container_insights import AGENT_POLICY_ARN
from infra.config.stack import CLUSTER_NAME_MAX
from infra.resources.cluster import NODE_POLICIES
from infra.resources.network import NAT_GATEWAYS, zone_cidrs
from infra.resources.node_groups import SYSTEM_LABELS
from infra.resources.observability import addon_configuration, dashboard_body, put_metric_data_policy
from platform_facts import GPU_TOLERATION
from tests.harness.fake_aws import (
    COREDNS_VERSIONS,
    OBSERVABILITY_VERSIONS,
    ZONE_IDS,
    FakeAws,
    capacity_block,
    capacity_reservation,
)
from tests.harness.program import (
    ACCOUNT,
    ROOT,
    STACK_FILES,
    Plan,
    Registration,
    config_of,
    dev_config,
    run_program,
    stack_config,
)
from training.metrics.cloudwatch_facts import CLUSTER_NAME_ENV
from workloads.training_run import readiness

COMPONENTS = {
    "eks-ray-train:infra:Network",
    "eks-ray-train:infra:Cluster",
    "eks-ray-train:infra:SystemNodeGroup",
    "eks-ray-train:infra:GpuNodeGroup",
    "eks-ray-train:infra:CheckpointStore",
    "eks-ray-train:workloads:Addons",
    "eks-ray-train:workloads:RayCluster",
    "eks-ray-train:infra:Observability",
}
TRAINING_RUN = "pulumi-python:dynamic/workloads:TrainingRun"
PRICE_LIST_PROVIDER = ("pulumi:providers:aws", "price-list")  # `infra.pricing`, outside us-east-1


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
    # The first three zones (by name) offering the system type; the GPU zone is one of them here.
    assert sorted(zones) == [f"{region}a", f"{region}b", f"{region}c"]


def test_cluster_settings(stack_plan):
    _, plan = stack_plan
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
    assert addons == {"coredns", "amazon-cloudwatch-observability"}


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


def subnet_with_id(plan: Plan, subnet_id: str):
    """The subnet registration behind an id (the mocks give each resource the id `<name>-id`)."""
    return next(r for r in plan.of_type("aws:ec2/subnet:Subnet") if f"{r.name}-id" == subnet_id)


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
        if (registration.type, registration.name) == PRICE_LIST_PROVIDER:
            continue  # it serves the Price List invoke at preview alone and manages nothing
        assert set(plan.ancestors(registration)) & COMPONENTS, (
            f"{registration.type} {registration.name} has no component"
        )


def test_kubeconfig_is_secret(stack_plan):
    _, plan = stack_plan
    providers = plan.of_type("pulumi:providers:kubernetes")
    assert sorted(provider.name for provider in providers) == ["eks", "eks-crds"]
    assert all("kubeconfig" in provider.secret_inputs for provider in providers)


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


# Bad stack values, each set on top of Pulumi.dev.yaml: (the value, the key the refusal must name,
# a piece of the refusal). Keys without a namespace are the project's. Every one must stop the
# program before it registers any resource: a refusal after the VPC exists costs a NAT gateway.
NEWLINE_RUN_NAME = "exp1\nrm -rf /"
BAD_CONFIGS = [
    # Shapes: full matches, so a trailing newline, tab or space never slips through.
    ({"training": json.dumps({"runName": NEWLINE_RUN_NAME})}, "training.runName", "expected a folder name"),
    ({"training": '{"runName": "../escape"}'}, "training.runName", "no '/'"),
    ({"clusterName": "eks-ray-train\n"}, "clusterName", "expected something like"),
    ({"namespace": "ray-train\t"}, "namespace", "expected something like"),
    ({"namespace": "n" * 64}, "namespace", "expected something like"),
    ({"kubernetesVersion": "1.36 "}, "kubernetesVersion", "expected something like"),
    ({"aws:region": "us-east-2\n"}, "aws:region", "expected a region name"),
    ({"capacityReservationId": "cr-0123456789abcdef0\n"}, "capacityReservationId", "expected something like"),
    (
        {"adminPrincipalArns": json.dumps(["arn:aws:iam::123456789012:role/ci\n"])},
        "adminPrincipalArns",
        "is not the ARN of an IAM user or role",
    ),
    ({"image": "rayproject/ray:2.58.0\n"}, "image", "no spaces, tabs or newlines"),
    ({"image": "rayproject/Ray:2.58.0"}, "image", "must be lowercase"),
    ({"rayVersion": "2.58.0\n"}, "rayVersion", "expected something like"),
    # Values EKS, AWS or the cluster would refuse later.
    ({"kubernetesVersion": "1.29"}, "kubernetesVersion", "EKS offers"),
    (
        {"endpointPublicAccessCidrs": json.dumps([f"203.0.113.{n}/32" for n in range(41)])},
        "endpointPublicAccessCidrs",
        "at most 40",
    ),
    ({"endpointPublicAccessCidrs": '["10.1.0.0/16"]'}, "endpointPublicAccessCidrs", "within 10.0.0.0/8"),
    (
        {"endpointPublicAccessCidrs": '["0.0.0.0/1", "128.0.0.0/1"]'},
        "endpointPublicAccessCidrs",
        "halves of it",
    ),
    ({"vpcCidr": "172.17.0.0/16"}, "vpcCidr", "Docker bridge"),
    ({"endpointPublicAccess": "false"}, "endpointPublicAccess", "a private endpoint refuses"),
    ({"vpcCidr": "169.254.0.0/16"}, "vpcCidr", "link-local"),
    ({"aws:region": "cn-north-1"}, "aws:region", "aws-cn partition"),
    ({"aws:region": "us-gov-west-1"}, "aws:region", "aws-us-gov partition"),
    ({"gpuNodeCount": "100000"}, "gpuNodeCount", "must be at most 450"),
    ({"systemNodeCount": "1000"}, "systemNodeCount", "must be at most 450"),
    ({"logRetentionDays": "10"}, "logRetentionDays", "CloudWatch Logs keeps logs"),
    ({"capacityReservationId": "cr-0123456789abcdef0"}, "capacityReservationId", "cr-0123456789abcdef0"),
    # Keys that contradict each other.
    ({"systemNodeType": "m7g.xlarge"}, "systemNodeType", "its CPU architecture is arm64"),
    ({"systemNodeType": "mac2.metal"}, "systemNodeType", "its CPU architecture is arm64_mac"),
    ({"gpuNodeType": "g5g.16xlarge"}, "gpuNodeType", "its CPU architecture is arm64"),
    ({"rayVersion": "2.41.0"}, "rayVersion", "the default image carries Ray 2.58.0"),
    ({"image": "rayproject/ray:2.41.0-py311-gpu"}, "rayVersion", "carries Ray 2.41.0"),
    ({"gpuNodeCount": "1"}, "gpuNodeCount", "never the network"),
    ({"training": '{"hsdpReplicas": 3}'}, "training", "8 workers are not a multiple of hsdpReplicas 3"),
    ({"training": '{"workers": 9}'}, "training.workers", "the GPU nodes hold 8 workers"),
    ({"benchmark": "true", "train": "false"}, "benchmark", "needs train: true"),
    (
        {"training": '{"data": "/home/me/corpus.jsonl"}'},
        "training.data",
        "the pods hold only the shipped code",
    ),
    ({"training": '{"data": "../corpus"}'}, "training.data", "the pods hold only the shipped code"),
    (
        {"training": '{"evalData": "/home/me/held-out.jsonl"}'},
        "training.evalData",
        "the pods hold only the shipped code",
    ),
    ({"training": '{"corpusCache": "/tmp/cache"}'}, "training.corpusCache", "a pod's folder is its own"),
    ({"workerCpu": "64"}, "workerCpu", "does not fit a g6.12xlarge node"),
    ({"gpuAz": "us-west-2a"}, "gpuAz", "is not in region us-east-2"),
    ({"gpuNodeType": "g6.xlarge"}, "gpuNodeType", "does not support EFA"),
    ({"gpuNodeType": "g9.unknown"}, "gpuNodeType", "is not offered in any zone of us-east-2"),
    # The training job's own parser.
    ({"training": '{"steps": 100000000000000000000}'}, "training.steps", "must be <= 10_000_000"),
    ({"training": '{"learningRate": "inf"}'}, "training.learningRate", "expected a finite number"),
    ({"training": '{"learningRate": "nan"}'}, "training.learningRate", "expected a finite number"),
    ({"training": '{"stepz": 5}'}, "training.stepz", "did you mean 'steps'"),
    ({"training": '{"storagePath": "/tmp"}'}, "training.storagePath", "set by the program"),
    ({"training": '{"modelId": "org/model $(date)"}'}, "training.modelId", "use letters, digits"),
    # Keys in the wrong place, and secrets in plain text.
    ({"gpuNodeCont": "2"}, "gpuNodeCont", "did you mean 'gpuNodeCount'"),
    ({"region": "us-east-2"}, "eks-ray-train:region", "set 'aws:region' instead"),
    ({"profile": "team"}, "eks-ray-train:profile", "set 'aws:profile' instead"),
    ({"hfToken": "hf_plain"}, "hfToken", "stored in plain text in the stack file"),
    (
        {
            "aws:assumeRoles": json.dumps(
                [{"roleArn": f"arn:aws:iam::123456789012:role/r{n}"} for n in range(2)]
            )
        },
        "aws:assumeRoles",
        "chain",
    ),
]


@pytest.mark.parametrize(
    "overrides, key, message",
    BAD_CONFIGS,
    ids=[f"{key}-{index}" for index, (_, key, _) in enumerate(BAD_CONFIGS)],
)
def test_bad_config_stops_the_program_before_any_resource(overrides, key, message):
    config = dev_config()
    config.update(
        {name if ":" in name else f"eks-ray-train:{name}": value for name, value in overrides.items()}
    )
    region = config["aws:region"].strip()
    with pytest.raises(pulumi.RunError) as raised:
        run_program(config, FakeAws(region=region if region in ZONE_IDS else "us-east-2"))
    refusal = str(raised.value)
    assert f"'{key}'" in refusal, refusal
    assert message in refusal, refusal
    assert "\n" not in refusal.strip(), refusal  # one line
    assert raised.value.plan.resources == []


def test_destroy_order_follows_explicit_dependencies(stack_plan):
    """Pulumi deletes dependents first: RayCluster before the operator, node groups before the cluster."""
    _, plan = stack_plan
    cluster = plan.one("eks:index:Cluster").urn
    policies = {
        r.urn
        for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.inputs["policyArn"] in NODE_POLICIES
    }
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert cluster in group.dependencies, group.name
        assert policies <= set(group.dependencies), group.name
    node_groups = {r.urn for r in plan.of_type("aws:eks/nodeGroup:NodeGroup")}
    for release in plan.of_type("kubernetes:helm.sh/v3:Release"):
        assert node_groups <= set(release.dependencies), release.name
    for addon in plan.of_type("aws:eks/addon:Addon"):
        assert cluster in addon.dependencies, addon.name
    for provider in plan.of_type("pulumi:providers:kubernetes"):
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
    assert readiness.uses_gpus(args)  # so readiness reads each worker pod's driver and memlock limit
    assert run.inputs["benchmark"] == (config.get("eks-ray-train:benchmark") == "true")
    text = repr(run.inputs).lower()
    for secret_word in ("kubeconfig", "token", "password", "certificate-authority", "secret"):
        assert secret_word not in text


def test_no_training_run_when_train_is_off():
    plan = run_program(dev_config(train="false"), FakeAws(region="us-east-2"))
    assert plan.of_type(TRAINING_RUN) == []


def test_too_many_workers_fails_in_preview():
    with pytest.raises(pulumi.RunError, match=r"'training\.workers' = 9"):
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
    """Nodes get only the AWS-managed node policies, the CloudWatch agent its own through a role of its
    own (`test_the_agents_role_is_its_service_accounts_alone`); only the Ray pods' service account
    reaches the bucket."""
    import json

    config, plan = stack_plan
    attached = {
        r.inputs["policyArn"] for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert attached == {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
        "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
        AGENT_POLICY_ARN,
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
    bucket_policy = json.loads(
        plan.one("aws:iam/rolePolicy:RolePolicy", "checkpoints-ray-pods").inputs["policy"]
    )
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

    from tests.harness.program import ROOT

    requirements = (ROOT / "requirements.txt").read_text().lower()
    for package in ("torch", "ray", "transformers"):
        assert not any(line.strip().startswith(package) for line in requirements.splitlines()), package
    script = (
        "import sys\n"
        "from tests.harness.fake_aws import FakeAws\n"
        "from tests.harness.program import ACCOUNT, STACK_FILES, USER_SETTINGS, run_program, stack_config\n"
        "config = {**stack_config(STACK_FILES[0]), **USER_SETTINGS}\n"
        "run_program(config, FakeAws(region=config['aws:region']))\n"
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


# --- capacity reservations across runs ------------------------------------------------------------

RESERVATION = "cr-0123456789abcdef0"
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
GPU_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def test_second_up_passes_with_this_stacks_own_nodes_filling_the_reservation():
    fake = FakeAws(region="us-east-2", reservations={RESERVATION: capacity_reservation("us-east-2b")})
    first = run_program(dev_config(capacityReservationId=RESERVATION), fake)
    # The world after the first `pulumi up`: EKS launched the 2 GPU nodes into the reservation,
    # tagged with the cluster's name, and EC2 now reports none of its instances available.
    fake.launch_into_reservation(RESERVATION, first.one("eks:index:Cluster").inputs["name"], 2)
    assert fake.reservations[RESERVATION]["availableInstanceCount"] == 0
    second = run_program(dev_config(capacityReservationId=RESERVATION), fake)
    for plan in (first, second):
        template = plan.one(GPU_TEMPLATE, "gpu").inputs
        target = template["capacityReservationSpecification"]["capacityReservationTarget"]
        assert target["capacityReservationId"] == RESERVATION
    assert second.one(GPU_TEMPLATE, "gpu").inputs == first.one(GPU_TEMPLATE, "gpu").inputs


def test_another_cluster_filling_the_reservation_stops_the_program():
    fake = FakeAws(region="us-east-2", reservations={RESERVATION: capacity_reservation("us-east-2b")})
    fake.launch_into_reservation(RESERVATION, "someone-elses-cluster", 2)
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(capacityReservationId=RESERVATION), fake)
    assert f"capacity reservation {RESERVATION} has 0 of its 2 g6.12xlarge instance(s) available" in str(
        raised.value
    )
    assert raised.value.plan.resources == []


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


# --- the run's window: the deadline the job gets, and the preview's verdict --------------------------


def block_run(
    monkeypatch, starts: timedelta, ends: timedelta, **config: str
) -> tuple[Plan, list[tuple[str, str]]]:
    """The program at NOW with a Capacity Block of p5.48xlarge in us-east-2b; its log lines."""
    logged: list[tuple[str, str]] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: logged.append(("info", message)))
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: logged.append(("warn", message)))
    fake = FakeAws(reservations={RESERVATION: capacity_block("us-east-2b", NOW, starts, ends)})
    settings = {"capacityReservationId": RESERVATION, "gpuNodeType": "p5.48xlarge", **config}
    return run_program(dev_config(**settings), fake, now=NOW), logged


def job_deadline(plan: Plan) -> str | None:
    """The job's --deadline, checked to be given at most once."""
    args = plan.one(TRAINING_RUN).inputs["job_args"]
    assert args.count("--deadline") <= 1, args
    return args[args.index("--deadline") + 1] if "--deadline" in args else None


def window_lines(logged: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(level, message) for level, message in logged if message.startswith("run window: ")]


def test_a_block_with_time_to_spare_gives_the_job_its_end_less_40_minutes(monkeypatch):
    plan, logged = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5))
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"  # the block ends at 14:00
    assert plan.one(TRAINING_RUN).inputs.get("not_before") is None
    ((level, line),) = window_lines(logged)
    assert level == "info"
    assert line.startswith(
        f"run window: Capacity Block {RESERVATION} ends at 2026-12-05T14:00:00Z; EKS scales its node group to 0 "
        "at 2026-12-05T13:20:00Z, 40 min before"
    )
    # A fresh stack: the control plane, the nodes, the image and the gate before the first step.
    assert (
        "start-up control plane 15 min, then GPU nodes 5 min + image pull 10 min + fabric gate 1 min: "
        "the job starts about 2026-12-05T09:31:00Z"
    ) in line
    assert "the run fits before --deadline 2026-12-05T13:20:00Z with 3 h 48 min to spare" in line


def test_a_block_too_short_for_the_steps_warns_how_many_fit(monkeypatch):
    plan, logged = block_run(
        monkeypatch, timedelta(hours=-1), timedelta(hours=5), training='{"preset": "smoke", "steps": 200000}'
    )
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"
    ((level, line),) = window_lines(logged)
    fit = re.search(
        r"only (\d+) of the 200000 configured steps fit before --deadline 2026-12-05T13:20:00Z", line
    )
    assert level == "warn" and fit, line
    assert 0 < int(fit.group(1)) < 200000
    assert f"the job stops at its deadline with a checkpoint of step {fit.group(1)}" in line


def test_a_block_ending_before_one_checkpointed_step_is_refused_naming_it_and_its_end():
    fake = FakeAws(
        reservations={
            RESERVATION: capacity_block("us-east-2b", NOW, timedelta(hours=-23), timedelta(hours=1))
        }
    )
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge"), fake, now=NOW)
    message = str(raised.value)
    assert message.startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': Capacity Block {RESERVATION} ends at "
        "2026-12-05T10:00:00Z; EKS scales its node group to 0 at 2026-12-05T09:20:00Z"
    )
    assert "the job starts about 2026-12-05T09:31:00Z, after the deadline" in message
    assert "not even one checkpointed step fits" in message and "\n" not in message
    assert raised.value.plan.of_type(TRAINING_RUN) == []


def test_a_block_starting_within_the_timeout_is_waited_for_by_the_training_run(monkeypatch):
    plan, logged = block_run(monkeypatch, timedelta(minutes=30), timedelta(hours=5))
    assert plan.one(TRAINING_RUN).inputs["not_before"] == "2026-12-05T09:30:00+00:00"
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"
    ((_, line),) = window_lines(logged)
    # The control plane is built meanwhile; the GPU nodes launch at the start.
    assert (
        "start-up control plane 15 min, the block's start at 2026-12-05T09:30:00Z, then GPU nodes 5 min + "
        "image pull 10 min + fabric gate 1 min: the job starts about 2026-12-05T09:46:00Z"
    ) in line


def test_a_block_starting_after_the_timeout_is_refused_with_its_start():
    fake = FakeAws(
        reservations={RESERVATION: capacity_block("us-east-2b", NOW, timedelta(hours=2), timedelta(hours=26))}
    )
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge"), fake, now=NOW)
    assert str(raised.value).startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': the Capacity Block starts at 2026-12-05T11:00:00Z, "
        "in 2 h 00 min, and `pulumi up` waits for it at most training.timeoutMinutes (60 min)"
    )
    assert raised.value.plan.resources == []


def test_an_odcr_with_an_end_date_is_the_jobs_deadline_one_without_gives_none(monkeypatch):
    ending = capacity_reservation("us-east-2b", end_date=datetime(2026, 12, 6, 0, 0, tzinfo=UTC))
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION), FakeAws(reservations={RESERVATION: ending}), now=NOW
    )
    assert job_deadline(plan) == "2026-12-06T00:00:00Z"  # a soft end: no 40 minutes kept back
    unlimited = capacity_reservation("us-east-2b")
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION), FakeAws(reservations={RESERVATION: unlimited}), now=NOW
    )
    assert job_deadline(plan) is None


def test_training_deadline_before_the_blocks_end_is_the_jobs_one_deadline(monkeypatch):
    earlier = '{"preset": "smoke", "deadline": "2026-12-05T12:00:00Z"}'
    plan, logged = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5), training=earlier)
    assert job_deadline(plan) == "2026-12-05T12:00:00Z"
    ((_, line),) = window_lines(logged)
    assert line.startswith("run window: training.deadline 2026-12-05T12:00:00Z.")
    later = '{"preset": "smoke", "deadline": "2026-12-05T18:00:00Z"}'
    plan, _ = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5), training=later)
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"  # the block's usable end replaces it


def test_a_training_deadline_too_near_is_refused_naming_the_key():
    near = '{"preset": "smoke", "deadline": "2026-12-05T09:10:00Z"}'
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(training=near), FakeAws(), now=NOW)
    assert str(raised.value).startswith(
        "config key 'training.deadline' = '2026-12-05T09:10:00Z': training.deadline 2026-12-05T09:10:00Z. "
        "Predicted: start-up control plane 15 min"
    )
    assert "not even one checkpointed step fits; set a later training.deadline, or remove it" in str(
        raised.value
    )


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


def test_node_groups_follow_the_control_plane_version(stack_plan):
    """Managed node groups keep the version they were created with, and EKS refuses the next
    control-plane upgrade while they lag ("Nodegroups must be updated to match cluster version"):
    both take the cluster's applied version, so they update after the control plane."""
    _, plan = stack_plan
    cluster = plan.one("eks:index:Cluster")
    for name in ("system", "gpu"):
        group = plan.one(NODE_GROUP, name)
        # The cluster's output: unknown in a first preview, the applied version afterwards.
        assert (
            isinstance(group.inputs["version"], Unknown)
            or group.inputs["version"] == cluster.inputs["version"]
        )
        assert cluster.urn in group.dependencies, name


def test_coredns_is_pinned_to_the_newest_build_for_the_cluster_version():
    plan = run_program(dev_config(kubernetesVersion="1.34"), FakeAws(region="us-east-2"))
    assert plan.one("aws:eks/addon:Addon", "coredns").inputs["addonVersion"] == COREDNS_VERSIONS["1.34"]
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), FakeAws(region="us-east-2"))
    assert upgraded.one("aws:eks/addon:Addon", "coredns").inputs["addonVersion"] == COREDNS_VERSIONS["1.35"]


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


# --- a second `pulumi up`: the GPU zone moves, every other zone's subnets stay ----------------------

SUBNET = "aws:ec2/subnet:Subnet"
# Inputs of aws.ec2.Subnet whose change makes Pulumi replace the subnet (ForceNew in the AWS provider).
SUBNET_REPLACE_KEYS = ("vpcId", "availabilityZone", "cidrBlock")


def subnets_by_name(plan: Plan) -> dict[str, dict]:
    return {r.name: r.inputs for r in plan.of_type(SUBNET)}


def subnet_conflicts(before: Plan, after: Plan) -> list[str]:
    """Subnets the update would create whose block overlaps a subnet still in the VPC.

    Pulumi replaces a resource by creating the new one before deleting the old, and creates new
    resources before deleting removed ones; EC2's CreateSubnet refuses a block that overlaps any
    subnet of the VPC (InvalidSubnet.Conflict). So every subnet created by the update meets every
    subnet of the first deploy.
    """
    old, new = subnets_by_name(before), subnets_by_name(after)
    created = {
        name: inputs
        for name, inputs in new.items()
        if name not in old or any(old[name].get(k) != inputs.get(k) for k in SUBNET_REPLACE_KEYS)
    }
    return [
        f"{name} ({inputs['cidrBlock']}) overlaps {other} ({existing['cidrBlock']})"
        for name, inputs in created.items()
        for other, existing in old.items()
        if ipaddress.ip_network(inputs["cidrBlock"]).overlaps(ipaddress.ip_network(existing["cidrBlock"]))
    ]


def test_subnet_conflict_check_catches_positional_subnets():
    """The check itself: subnets named by position swap zones when the GPU zone moves, and collide."""

    def plan_of(*subnets: tuple[str, str, str]) -> Plan:
        plan = Plan()
        for name, zone, block in subnets:
            inputs = {"vpcId": "vpc-1", "availabilityZone": zone, "cidrBlock": block}
            plan.resources.append(Registration(SUBNET, name, f"urn:{name}", "", [], inputs, set()))
        return plan

    first = plan_of(("private-0", "us-east-2a", "10.0.0.0/18"), ("private-1", "us-east-2b", "10.0.64.0/18"))
    moved = plan_of(("private-0", "us-east-2b", "10.0.0.0/18"), ("private-1", "us-east-2a", "10.0.64.0/18"))
    assert len(subnet_conflicts(first, moved)) == 2
    assert subnet_conflicts(first, first) == []


@pytest.mark.parametrize(
    "region, move, new_gpu_zone",
    [
        ("us-east-2", {"gpuAz": "us-east-2b"}, "us-east-2b"),
        ("us-east-2", {"capacityReservationId": "cr-0123456789abcdef0"}, "us-east-2c"),
        # Outside the home zones (us-east-1a-c): the GPU zone gets a private subnet of its own.
        ("us-east-1", {"gpuAz": "us-east-1d"}, "us-east-1d"),
    ],
    ids=["gpuAz", "reservation", "gpuAz-outside-home-zones"],
)
def test_moving_the_gpu_zone_keeps_every_other_zones_subnets(region, move, new_gpu_zone):
    stack_file = next(f for f in STACK_FILES if stack_config(f)["aws:region"] == region)
    fake = FakeAws(region=region, reservations={"cr-0123456789abcdef0": capacity_reservation("us-east-2c")})
    first = run_program(config_of(stack_file), fake)
    second = run_program(config_of(stack_file, **move), fake)

    before, after = subnets_by_name(first), subnets_by_name(second)
    for name, inputs in before.items():
        assert name in after, f"{name} would be deleted"
        assert {k: after[name][k] for k in SUBNET_REPLACE_KEYS} == {k: inputs[k] for k in SUBNET_REPLACE_KEYS}
    assert subnet_conflicts(first, second) == []
    gpu_subnet = subnet_with_id(second, gpu_group(second).inputs["subnetIds"][0])
    assert gpu_subnet.inputs["availabilityZone"] == new_gpu_zone
    # The control plane and the system nodes keep their subnets.
    assert plan_cluster_subnets(first) == plan_cluster_subnets(second)


def plan_cluster_subnets(plan: Plan) -> tuple[list, list]:
    cluster = plan.one("eks:index:Cluster").inputs
    system = next(
        r for r in plan.of_type("aws:eks/nodeGroup:NodeGroup") if r.inputs["labels"] == SYSTEM_LABELS
    )
    return cluster["privateSubnetIds"], system.inputs["subnetIds"]


def test_zones_a_to_c_keep_the_blocks_of_the_positional_plan():
    """The earlier plan: private quarters by position, public /22s from the last quarter, GPU zone first.

    A stack deployed in zones a (GPU) and b, the default of every stack file, keeps its blocks and,
    through aliases of the old names, its subnets and route table associations.
    """
    assert zone_cidrs("10.0.0.0/16", "us-east-2a") == ("10.0.0.0/18", "10.0.192.0/22")
    assert zone_cidrs("10.0.0.0/16", "us-east-2b") == ("10.0.64.0/18", "10.0.196.0/22")
    assert zone_cidrs("10.0.0.0/16", "us-east-1d") == ("10.0.224.0/21", "10.0.204.0/22")
    plan = run_program(dev_config(), FakeAws(region="us-east-2"))
    aliases = {
        r.name: r.alias_names
        for r in plan.resources
        if r.type in (SUBNET, "aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    for tier in ("private", "public"):
        assert aliases[f"eks-ray-train-{tier}-us-east-2a"] == [f"eks-ray-train-{tier}-0"]
        assert aliases[f"eks-ray-train-{tier}-us-east-2b"] == [f"eks-ray-train-{tier}-1"]
        assert aliases[f"eks-ray-train-{tier}-us-east-2c"] == []


# --- credentials: the stack's AWS identity reaches the Kubernetes provider ----------------------------


def kubeconfig_token_args(plan: Plan) -> list[str]:
    provider = plan.one("pulumi:providers:kubernetes", "eks")
    assert "kubeconfig" in provider.secret_inputs
    kubeconfig = json.loads(pulumi.runtime.rpc.unwrap_rpc_secret(provider.inputs["kubeconfig"]))
    return kubeconfig["users"][0]["user"]["exec"]["args"]


def test_aws_profile_and_role_reach_the_kubernetes_provider():
    role = "arn:aws:iam::123456789012:role/deployer"
    config = {
        **dev_config(),
        "aws:profile": "team-gpu",
        "aws:assumeRoles": json.dumps([{"roleArn": role, "sessionName": "pulumi"}]),
    }
    plan = run_program(config, FakeAws(region="us-east-2"))
    args = kubeconfig_token_args(plan)
    assert args[args.index("--profile") + 1] == "team-gpu"
    assert args[args.index("--role") + 1] == role
    assert args[args.index("--cluster-name") + 1] == "eks-ray-train"
    opts = plan.one("eks:index:Cluster").inputs["providerCredentialOpts"]
    assert opts == {"profileName": "team-gpu", "roleArn": role}


def test_without_a_profile_the_kubeconfig_uses_the_default_credentials():
    plan = run_program(dev_config(), FakeAws(region="us-east-2"))
    args = kubeconfig_token_args(plan)
    assert "--profile" not in args and "--role" not in args
    assert "providerCredentialOpts" not in plan.one("eks:index:Cluster").inputs


# --- items that must hold on every stack file ---------------------------------------------------------

ADMINS = ["arn:aws:iam::123456789012:role/platform/ci-deployer", "arn:aws:iam::210987654321:user/alice"]


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def test_admin_principals_become_cluster_admin_access_entries(stack_file):
    config = config_of(stack_file, adminPrincipalArns=json.dumps(ADMINS))
    plan = run_program(config, FakeAws(region=config["aws:region"]))
    cluster = plan.one("eks:index:Cluster").urn
    entries = plan.of_type("aws:eks/accessEntry:AccessEntry")
    assert sorted(e.inputs["principalArn"] for e in entries) == sorted(ADMINS)
    for entry in entries:
        assert entry.inputs["clusterName"] == config["eks-ray-train:clusterName"]
        assert entry.inputs["type"] == "STANDARD" and cluster in entry.dependencies
    associations = plan.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert sorted(a.inputs["principalArn"] for a in associations) == sorted(ADMINS)
    for association in associations:
        assert association.inputs["policyArn"] == (
            "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        )
        assert association.inputs["accessScope"] == {"type": "cluster"}
    assert len({e.name for e in entries}) == len(ADMINS)


def test_no_access_entries_without_admin_principals(stack_plan):
    _, plan = stack_plan
    assert plan.of_type("aws:eks/accessEntry:AccessEntry") == []


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def test_longest_cluster_name_fits_every_derived_name(stack_file):
    name = "c" * CLUSTER_NAME_MAX
    config = config_of(stack_file, clusterName=name)
    plan = run_program(config, FakeAws(region=config["aws:region"]))
    # Pulumi autonames a role "<resource name>-<7 random characters>"; IAM role names stop at 64.
    role_names = [r.name for r in plan.of_type("aws:iam/role:Role")] + [f"{name}-eksRole-role"]
    assert all(len(role) + 8 <= 64 for role in role_names), role_names
    assert max(len(role) + 8 for role in role_names) == 64
    with pytest.raises(
        pulumi.RunError, match=f"'clusterName' = '{name}c': at most {CLUSTER_NAME_MAX} characters"
    ):
        run_program(config_of(stack_file, clusterName=name + "c"), FakeAws(region=config["aws:region"]))


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


def test_checkpoint_bucket_refuses_requests_without_tls(stack_plan):
    _, plan = stack_plan
    bucket = plan.one("aws:s3/bucket:Bucket")
    policy = plan.one("aws:s3/bucketPolicy:BucketPolicy")
    assert policy.inputs["bucket"] == f"{bucket.name}-id"
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    arn = f"arn:aws:s3:::{bucket.inputs['bucket']}"
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*" and statement["Action"] == "s3:*"
    assert statement["Resource"] == [arn, f"{arn}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    public_access = plan.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").urn
    assert public_access in policy.dependencies


def test_control_plane_log_group_exists_before_the_cluster_with_a_retention(stack_plan):
    config, plan = stack_plan
    group = plan.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/eks/{config['eks-ray-train:clusterName']}/cluster"
    assert group.inputs["retentionInDays"] == 30
    assert group.urn in plan.one("eks:index:Cluster").dependencies


def test_log_retention_is_configurable():
    plan = run_program(dev_config(logRetentionDays="90"), FakeAws(region="us-east-2"))
    assert plan.one("aws:cloudwatch/logGroup:LogGroup").inputs["retentionInDays"] == 90


def test_system_nodes_have_room_for_the_ray_head_image(stack_plan):
    _, plan = stack_plan
    template = plan.one("aws:ec2/launchTemplate:LaunchTemplate", "system").inputs
    assert template["blockDeviceMappings"][0]["ebs"]["volumeSize"] >= 80


def test_a_run_longer_than_its_timeout_is_warned_at_preview(monkeypatch):
    """5000 throughput steps on 8 L4s need at least 83 minutes even at 70% MFU; pulumi up follows 60."""
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    run_program(dev_config(training='{"preset": "throughput", "steps": 5000}'), FakeAws(region="us-east-2"))
    late = [
        warning for warning in warnings if warning.startswith("config key 'training.timeoutMinutes' = 60")
    ]
    assert len(late) == 1 and "at least 83 minutes on NVIDIA L4 GPUs" in late[0], warnings
    warnings.clear()
    run_program(
        dev_config(training='{"preset": "throughput", "steps": 5000, "timeoutMinutes": 120}'), FakeAws()
    )
    assert not [warning for warning in warnings if "timeoutMinutes" in warning]


def test_ray_head_is_closed_to_other_namespaces_before_it_starts(stack_plan):
    config, plan = stack_plan
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    policy = plan.one("kubernetes:networking.k8s.io/v1:NetworkPolicy")
    assert plan.ancestors(policy)[0] == "eks-ray-train:workloads:RayCluster"
    assert policy.inputs["metadata"]["namespace"] == namespace
    assert policy.inputs["spec"]["podSelector"]["matchLabels"] == {
        "ray.io/cluster": "ray-train",
        "ray.io/node-type": "head",
    }
    assert policy.inputs["spec"]["ingress"] == [{"from": [{"podSelector": {}}]}]
    assert policy.urn in plan.one("kubernetes:ray.io/v1:RayCluster").dependencies
    # Enforced only with the VPC CNI's network policy agent on.
    assert plan.one("eks:index:Cluster").inputs["vpcCniOptions"]["enableNetworkPolicy"] is True
    labels = plan.one("kubernetes:core/v1:Namespace", namespace).inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"


def test_the_efa_counter_reader_runs_on_the_gpu_nodes_in_its_own_namespace(stack_plan):
    """The only pods that see the nodes' EFA counters (`hostNetwork`), in a namespace that admits them
    (the Ray namespace's `baseline` does not), from the Ray image, beside the device plugins."""
    _, plan = stack_plan
    daemonset = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters")
    assert plan.ancestors(daemonset)[0] == "eks-ray-train:workloads:Addons"
    assert daemonset.inputs["metadata"]["namespace"] == "efa-counters"
    pod = daemonset.inputs["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["nodeSelector"] == {"role": "gpu-worker"}
    assert (
        pod["containers"][0]["image"]
        == plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["workerGroupSpecs"][0]["template"][
            "spec"
        ]["containers"][0]["image"]
    )
    namespace = plan.one("kubernetes:core/v1:Namespace", "efa-counters")
    assert namespace.urn in daemonset.dependencies
    assert namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_control_plane_logs_are_encrypted_with_the_cluster_key(stack_plan):
    config, plan = stack_plan
    region, cluster_name = config["aws:region"], config["eks-ray-train:clusterName"]
    key = plan.one("aws:kms/key:Key")
    group = plan.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["kmsKeyId"] == f"arn:aws:service:{region}:{ACCOUNT}:key/{key.name}"
    assert key.urn in group.dependencies and group.urn in plan.one("eks:index:Cluster").dependencies
    root, logs = json.loads(key.inputs["policy"])["Statement"]
    assert root["Principal"] == {"AWS": f"arn:aws:iam::{ACCOUNT}:root"} and root["Action"] == "kms:*"
    assert logs["Principal"] == {"Service": f"logs.{region}.amazonaws.com"}
    assert "kms:Decrypt" not in logs["Action"] and "kms:GenerateDataKey*" in logs["Action"]
    assert logs["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"] == (
        f"arn:aws:logs:{region}:{ACCOUNT}:log-group:/aws/eks/{cluster_name}/cluster"
    )


def test_checkpoint_bucket_keeps_versions_and_survives_destroy_unless_asked(stack_plan):
    _, plan = stack_plan
    bucket = plan.one("aws:s3/bucket:Bucket")
    assert bucket.inputs["forceDestroy"] is False
    versioning = plan.one("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["bucket"] == f"{bucket.name}-id"
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}
    lifecycle = plan.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    [rule] = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled" and rule["filter"] == {"prefix": ""}
    assert rule["noncurrentVersionExpiration"] == {"noncurrentDays": 30}
    assert rule["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
    assert versioning.urn in lifecycle.dependencies


def test_force_destroy_is_the_users_choice():
    plan = run_program(dev_config(checkpointsForceDestroy="true"), FakeAws(region="us-east-2"))
    assert plan.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is True


def test_default_security_group_has_no_rules_and_flow_logs_are_off(stack_plan):
    _, plan = stack_plan
    vpc = plan.one("aws:ec2/vpc:Vpc")
    default_group = plan.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert default_group.inputs["vpcId"] == f"{vpc.name}-id"
    assert not default_group.inputs.get("ingress") and not default_group.inputs.get("egress")
    assert plan.of_type("aws:ec2/flowLog:FlowLog") == []


def test_vpc_flow_logs_go_to_a_log_group_with_the_stacks_retention():
    plan = run_program(dev_config(vpcFlowLogs="true", logRetentionDays="90"), FakeAws(region="us-east-2"))
    flow_log = plan.one("aws:ec2/flowLog:FlowLog").inputs
    group = plan.one("aws:cloudwatch/logGroup:LogGroup", "eks-ray-train-flow-logs")
    assert group.inputs["name"] == "/aws/vpc-flow-logs/eks-ray-train"
    assert group.inputs["retentionInDays"] == 90
    # The mocks' ARN of the log group (tests/harness/program.py gives each resource one from its type and name).
    assert flow_log["logDestination"] == f"arn:aws:service:us-east-2:{ACCOUNT}:loggroup/{group.name}"
    assert (flow_log["trafficType"], flow_log["logDestinationType"]) == ("ALL", "cloud-watch-logs")
    assert flow_log["vpcId"] == f"{plan.one('aws:ec2/vpc:Vpc').name}-id"
    role = plan.one("aws:iam/role:Role", "eks-ray-train-flow-logs")
    [trust] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    delivery = json.loads(
        plan.one("aws:iam/rolePolicy:RolePolicy", "eks-ray-train-flow-logs").inputs["policy"]
    )
    assert delivery["Statement"][0]["Resource"][0] == flow_log["logDestination"]


def test_an_image_tag_is_warned_with_how_to_pin_its_digest(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    run_program(dev_config(), FakeAws(region="us-east-2"))
    tagged = [warning for warning in warnings if warning.startswith("config key 'image'")]
    assert len(tagged) == 1 and "docker buildx imagetools inspect" in tagged[0]
    assert "pulumi config set image public.ecr.aws/deep-learning-containers/ray@sha256:<digest>" in tagged[0]
    warnings.clear()
    pinned = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "a" * 64
    plan = run_program(dev_config(image=pinned), FakeAws(region="us-east-2"))
    assert not [warning for warning in warnings if warning.startswith("config key 'image'")]
    assert (
        plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["headGroupSpec"]["template"]["spec"][
            "containers"
        ][0]["image"]
        == pinned
    )


# --- a later `pulumi up` on a live stack: the KubeRay CRDs, the RayCluster, the EFA plugin -------------

CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
RELEASE = "kubernetes:helm.sh/v3:Release"
# What makes pulumi-kubernetes replace (delete, then create) an object rather than patch it: its
# identity (provider/pkg/provider/provider.go, `Diff`: apiVersion/kind or metadata name/namespace).
# A replaced CRD deletes every object of its kind, so every RayCluster with it.
OBJECT_IDENTITY = ("apiVersion", "kind", "metadata.name", "metadata.namespace")
# pulumi-kubernetes `helm_release.go` Diff: `forceNewFields` ".name", ".namespace".
RELEASE_IDENTITY = ("name", "namespace")


def field_at(inputs: dict, path: str):
    for key in path.split("."):
        inputs = inputs.get(key, {}) if isinstance(inputs, dict) else {}
    return inputs


def engine_step(before: Registration | None, after: Registration, identity: tuple[str, ...]) -> str:
    """What `pulumi up` does with a registration given the state of the earlier deploy: create,
    same (inputs unchanged), update (patched in place) or replace (an identity field changed)."""
    if before is None:
        return "create"
    if before.inputs == after.inputs:
        return "same"
    changed = [key for key in identity if field_at(before.inputs, key) != field_at(after.inputs, key)]
    return "replace" if changed else "update"


def test_kuberay_crds_are_the_programs_applied_server_side_and_adopted_in_place(stack_plan):
    """On stacks deployed before, Helm created the CRDs: the program's first `up` must patch them, not
    fail on "already exists" (pulumi-kubernetes, pinned 4.34.2, creates with a client-side create unless the
    provider sets `upsertExistingObjects`) and never delete them (that deletes every RayCluster)."""
    _, plan = stack_plan
    crds = plan.of_type(CRD)
    assert sorted(crd.name for crd in crds) == [
        "rayclusters.ray.io",
        "raycronjobs.ray.io",
        "rayjobs.ray.io",
        "rayservices.ray.io",
    ]
    for crd in crds:
        assert crd.inputs["metadata"]["name"] == crd.name
        assert crd.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert crd.retain_on_delete is True
        owner = plan.by_urn(crd.provider.rsplit("::", 1)[0])
        assert owner.name == "eks-crds"
        # Provider settings reach the engine as JSON text.
        assert owner.inputs["enableServerSideApply"] == "true"
        assert owner.inputs["upsertExistingObjects"] == "true"
    # The operator's release leaves the CRDs alone and starts after them; the RayCluster after both.
    operator = next(r for r in plan.of_type(RELEASE) if r.inputs["chart"] == "kuberay-operator")
    assert operator.inputs["skipCrds"] is True
    crd_urns = {crd.urn for crd in crds}
    assert crd_urns <= set(operator.dependencies)
    assert crd_urns <= set(plan.one(RAY_CLUSTER).dependencies)
    others = [r for r in plan.of_type(RELEASE) if r is not operator]
    assert all(not r.inputs.get("skipCrds") for r in others)
    # Every other Kubernetes object keeps the stack's first provider: nothing else is adopted silently.
    eks = plan.one("pulumi:providers:kubernetes", "eks")
    assert "upsertExistingObjects" not in eks.inputs
    kubernetes_objects = [r for r in plan.resources if r.type.startswith("kubernetes:") and r.type != CRD]
    assert kubernetes_objects and all(r.provider.rsplit("::", 1)[0] == eks.urn for r in kubernetes_objects)


def test_a_kuberay_chart_bump_upgrades_its_crds_in_place_before_the_operator(tmp_path, monkeypatch):
    """Helm never upgrades `crds/`: the program must, or the new operator's new fields are pruned."""
    from workloads.manifests import crd

    first = run_program(dev_config(), FakeAws(region="us-east-2"), crd_schemas=True)
    # The next chart version's CRDs: here the pinned ones with one more RayCluster field.
    bumped = tmp_path / "kuberay-v1.8.0"
    bumped.mkdir()
    for name in crd.KUBERAY_CRD_FILES:
        (bumped / name).write_text((crd.KUBERAY_CRD_DIR / name).read_text())
    rayclusters = bumped / "ray.io_rayclusters.yaml"
    text = rayclusters.read_text()
    anchor = "              upgradeStrategy:\n"
    assert text.count(anchor) == 1
    rayclusters.write_text(
        text.replace(anchor, "              newField:\n                type: string\n" + anchor)
    )
    monkeypatch.setattr(crd, "KUBERAY_CRD_DIR", bumped)
    second = run_program(dev_config(), FakeAws(region="us-east-2"), crd_schemas=True)

    steps = {
        crd.name: engine_step(first.one(CRD, crd.name), crd, OBJECT_IDENTITY) for crd in second.of_type(CRD)
    }
    assert steps == {
        "rayclusters.ray.io": "update",
        "raycronjobs.ray.io": "same",
        "rayjobs.ray.io": "same",
        "rayservices.ray.io": "same",
    }
    new_schema = second.one(CRD, "rayclusters.ray.io").inputs["spec"]["versions"][0]["schema"]
    spec_fields = new_schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec_fields["newField"] == {"type": "string"}
    operator = next(r for r in second.of_type(RELEASE) if r.inputs["chart"] == "kuberay-operator")
    assert second.one(CRD, "rayclusters.ray.io").urn in operator.dependencies


def test_a_changed_image_reaches_new_pods_and_the_run_waits_for_them():
    """KubeRay recreates the pods only with `upgradeStrategy: Recreate`; the RayCluster is patched,
    never replaced; both pod templates carry the new spec hash, which the TrainingRun waits for and
    re-runs on."""
    from workloads.training_run import provider as training_provider

    first = run_program(dev_config(), FakeAws(region="us-east-2"))
    second = run_program(
        dev_config(image="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.2"),
        FakeAws(region="us-east-2"),
    )
    before, after = first.one(RAY_CLUSTER), second.one(RAY_CLUSTER)
    assert engine_step(before, after, OBJECT_IDENTITY) == "update"
    assert after.inputs["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    run_before, run_after = first.one(TRAINING_RUN).inputs, second.one(TRAINING_RUN).inputs
    for plan, run in ((first, run_before), (second, run_after)):
        spec = plan.one(RAY_CLUSTER).inputs["spec"]
        templates = [spec["headGroupSpec"]["template"], spec["workerGroupSpecs"][0]["template"]]
        stamped = {t["metadata"]["annotations"]["eks-ray-train/spec-hash"] for t in templates}
        assert stamped == {run["run_spec_hash"]}
    assert run_after["run_spec_hash"] != run_before["run_spec_hash"]
    olds = {**run_before, "job_id": "eks-ray-train-main-0123456789ab"}
    assert training_provider.diff_props(olds, run_after).replaces == ["run_spec_hash"]
    # Ray's session folder, where the transport evidence lives, is an emptyDir on every pod.
    for template in templates:
        assert {"name": "ray-logs", "emptyDir": {}} in template["spec"]["volumes"]


def test_another_gpu_type_moves_the_efa_plugin_with_it():
    """The EFA chart's DaemonSet schedules only on `supportedInstanceLabels.values`: the release
    follows `gpuNodeType` and is upgraded in place."""
    first = run_program(dev_config(), FakeAws(region="us-east-2"))
    second = run_program(dev_config(gpuNodeType="g5.12xlarge"), FakeAws(region="us-east-2"))

    def efa(plan: Plan) -> Registration:
        return next(r for r in plan.of_type(RELEASE) if r.inputs["chart"] == "aws-efa-k8s-device-plugin")

    assert efa(first).inputs["values"]["supportedInstanceLabels"] == {
        "keys": ["node.kubernetes.io/instance-type"],
        "values": ["g6.12xlarge"],
    }
    assert efa(second).inputs["values"]["supportedInstanceLabels"]["values"] == ["g5.12xlarge"]
    assert engine_step(efa(first), efa(second), RELEASE_IDENTITY) == "update"


# --- observability: the CloudWatch add-on, the job's metrics, the dashboard ---------------------

OBSERVABILITY_ADDON = "amazon-cloudwatch-observability"
DASHBOARD = "aws:cloudwatch/dashboard:Dashboard"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def ray_pod_envs(plan: Plan) -> list[dict[str, str]]:
    spec = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    return [{e["name"]: e.get("value") for e in t["spec"]["containers"][0]["env"]} for t in templates]


def test_the_add_on_is_pinned_runs_on_every_node_and_has_an_identity_of_its_own(stack_plan):
    config, plan = stack_plan
    region = config["aws:region"]
    addon = plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON)
    assert (
        addon.inputs["addonVersion"]
        == OBSERVABILITY_VERSIONS[plan.one("eks:index:Cluster").inputs["version"]]
    )
    assert json.loads(addon.inputs["configurationValues"]) == addon_configuration()
    assert GPU_TOLERATION in addon_configuration()["tolerations"]
    # After both node groups (its DaemonSets must run before EKS calls it active), and the control plane.
    assert {plan.one(NODE_GROUP, "system").urn, plan.one(NODE_GROUP, "gpu").urn} <= set(addon.dependencies)
    assert plan.one("eks:index:Cluster").urn in addon.dependencies
    # IRSA: the agent's role trusts the cluster's OIDC provider for its service account alone.
    role = plan.one(ROLE, "observability-agent")
    assert addon.inputs["serviceAccountRoleArn"] == f"arn:aws:service:{region}:{ACCOUNT}:role/{role.name}"
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"]["Federated"].endswith(
        f"oidc-provider/oidc.eks.{region}.amazonaws.com/id/0123456789ABCDEF"
    )
    subjects = [v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    assert subjects == ["system:serviceaccount:amazon-cloudwatch:cloudwatch-agent"]
    (attachment,) = [
        r
        for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.inputs["policyArn"] == AGENT_POLICY_ARN
    ]
    assert attachment.inputs["role"] == role.name
    assert plan.ancestors(addon)[0] == "eks-ray-train:infra:Observability"


def test_the_ray_pods_may_publish_to_the_jobs_namespace_and_name_the_cluster(stack_plan):
    config, plan = stack_plan
    cluster = config["eks-ray-train:clusterName"]
    metrics = plan.one(ROLE_POLICY, "observability-ray-pods-metrics")
    assert metrics.inputs["role"] == "checkpoints-ray-pods-id"  # the IRSA role the Ray pods assume
    assert metrics.inputs["policy"] == put_metric_data_policy()
    assert [env.get(CLUSTER_NAME_ENV) for env in ray_pod_envs(plan)] == [cluster, cluster]
    # The run waits for the statement, so its first step is published; never for the add-on.
    run = plan.one(TRAINING_RUN)
    assert metrics.urn in run.dependencies
    assert plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON).urn not in run.dependencies


def test_the_dashboard_and_its_link(stack_plan):
    config, plan = stack_plan
    region, cluster = config["aws:region"], config["eks-ray-train:clusterName"]
    version = plan.one("aws:eks/addon:Addon", OBSERVABILITY_ADDON).inputs["addonVersion"]
    dashboard = plan.one(DASHBOARD)
    assert dashboard.inputs["dashboardName"] == f"{cluster}-{region}"
    assert json.loads(dashboard.inputs["dashboardBody"]) == dashboard_body(cluster, region, version)
    link = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards/dashboard/{cluster}-{region}"
    assert plan.outputs["dashboard"] == link
    assert plan.outputs["training"]["dashboard"] == link


def test_observability_off_creates_none_of_it():
    plan = run_program(dev_config(observability="false"), FakeAws(region="us-east-2"))
    assert [r.inputs["addonName"] for r in plan.of_type("aws:eks/addon:Addon")] == ["coredns"]
    assert plan.of_type(DASHBOARD) == []
    assert plan.of_type("eks-ray-train:infra:Observability") == []
    assert [r.name for r in plan.of_type(ROLE_POLICY)] == ["checkpoints-ray-pods"]
    assert AGENT_POLICY_ARN not in {
        r.inputs["policyArn"] for r in plan.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert all(CLUSTER_NAME_ENV not in env for env in ray_pod_envs(plan))
    assert "dashboard" not in plan.outputs
    assert plan.outputs["training"]["dashboard"] is None


def test_an_add_on_version_without_the_dashboards_metrics_stops_the_preview(monkeypatch):
    monkeypatch.setitem(OBSERVABILITY_VERSIONS, "1.36", "v4.10.3-eksbuild.1")
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(), FakeAws(region="us-east-2"))
    message = str(raised.value)
    assert message.startswith(
        "config key 'observability': amazon-cloudwatch-observability v4.10.3-eksbuild.1 predates v5.3.0"
    )
    assert "observability: false" in message and "\n" not in message.strip()
    assert not any(r.type == DASHBOARD for r in raised.value.plan.resources)


# --- training.cost: what preview knows of it -----------------------------------------------------

PRICE_LIST = "aws:pricing/getProduct:getProduct"
DEPLOYER = f"arn:aws:iam::{ACCOUNT}:role/ml-deployer"


def test_the_cost_names_the_price_lists_price_read_through_a_us_east_1_provider():
    """us-east-2 has no Price List endpoint: the invoke goes through the `price-list` provider in
    us-east-1 with the stack's profile and role, filtering on the stack's region."""
    fake = FakeAws(region="us-east-2")
    config = dev_config(**{"aws:profile": "ml", "aws:assumeRole": json.dumps({"roleArn": DEPLOYER})})
    plan = run_program(config, fake)
    cost = plan.outputs["training"]["cost"]
    assert cost["priceBasis"] == "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview"
    assert cost["usdPerGpuNodeHour"] == 4.6016
    assert cost["atRestUsdPerHour"]["systemNodeBasis"].endswith(
        "of m7i.xlarge in us-east-2, AWS Price List at preview"
    )
    assert cost["atRestUsdPerHour"]["parts"]["gpuNodes"] == 2 * 4.6016
    assert cost["predictedUsd"] is not None and "not the invoice" in cost["note"]
    (provider,) = plan.of_type("pulumi:providers:aws")
    assert (provider.name, provider.inputs["region"], provider.inputs["profile"]) == (
        "price-list",
        "us-east-1",
        "ml",
    )
    assert json.loads(provider.inputs["assumeRoles"])[0]["roleArn"] == DEPLOYER
    priced = [
        {f["field"]: f["value"] for f in args["filters"]} for token, args in fake.calls if token == PRICE_LIST
    ]
    assert [(f["instanceType"], f["regionCode"]) for f in priced] == [
        ("m7i.xlarge", "us-east-2"),
        ("g6.12xlarge", "us-east-2"),
    ]
    assert isinstance(cost["measured"], pulumi.Output)  # known once the TrainingRun has run


def test_in_a_price_list_region_the_stacks_own_provider_asks():
    plan = run_program(config_of(ROOT / "Pulumi.us-east-1.yaml"), FakeAws(region="us-east-1"))
    assert plan.of_type("pulumi:providers:aws") == []
    assert plan.outputs["training"]["cost"]["priceBasis"].endswith("in us-east-1, AWS Price List at preview")


def test_a_refused_price_list_falls_back_to_the_shipped_prices_naming_the_refusal():
    plan = run_program(dev_config(), FakeAws(region="us-east-2", denied={PRICE_LIST}))
    cost = plan.outputs["training"]["cost"]
    assert cost["usdPerGpuNodeHour"] == 4.6016
    assert cost["priceBasis"].startswith(
        "On-Demand list price of g6.12xlarge shipped with the stack (us-east-1"
    )
    assert (
        "the Price List was not used" in cost["priceBasis"] and "AccessDeniedException" in cost["priceBasis"]
    )
    assert cost["atRestUsdPerHour"]["parts"]["systemNodes"] == 0.2016


def test_a_capacity_blocks_cost_is_its_upfront_fee_which_no_api_returns():
    fake = FakeAws(
        region="us-east-2",
        reservations={RESERVATION: capacity_reservation("us-east-2b", reservation_type="capacity-block")},
    )
    cost = run_program(dev_config(capacityReservationId=RESERVATION), fake).outputs["training"]["cost"]
    assert cost["usdPerGpuNodeHour"] is None and cost["predictedUsd"] is None
    assert cost["priceBasis"].startswith(f"Capacity Block {RESERVATION}: its upfront fee")
    assert cost["atRestUsdPerHour"]["gpuNodesRunning"] is None
    assert cost["atRestUsdPerHour"]["gpuNodesAtZero"] is not None


def test_the_network_has_the_nat_gateways_the_cost_counts(stack_plan):
    _, plan = stack_plan
    assert len(plan.of_type("aws:ec2/natGateway:NatGateway")) == NAT_GATEWAYS
    assert len(plan.of_type("aws:ec2/eip:Eip")) == NAT_GATEWAYS
