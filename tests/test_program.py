"""The whole Pulumi program under Pulumi's mocks, once per stack file: the plan it would show."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pulumi
import pytest

from infra.aws_rules.container_insights import AGENT_POLICY_ARN
from infra.config.stack import CLUSTER_NAME_MAX, DEFAULT_IMAGE
from infra.resources.cluster import NODE_POLICIES
from platform_contract import GPU_RESOURCE, NO_GPU_ENV
from tests.harness.fake_aws import (
    ZONE_IDS,
    FakeAws,
    capacity_reservation,
)
from tests.harness.fake_oci_registry import serving_the_program, the_programs_images
from tests.harness.preview_queries import (
    GPU_TEMPLATE,
    RESERVATION,
    TRAINING_RUN,
)
from tests.harness.program import (
    ACCOUNT,
    ROOT,
    STACK_FILES,
    config_of,
    dev_config,
    run_program,
)
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


PRICE_LIST_PROVIDER = ("pulumi:providers:aws", "price-list")  # `infra.pricing`, outside us-east-1


def test_every_stack_file_is_complete_for_its_region(stack_plan):
    config, plan = stack_plan
    assert {r.type for r in plan.resources} >= COMPONENTS
    region = config["aws:region"]
    subnets = [r for r in plan.of_type("aws:ec2/subnet:Subnet") if "private" in r.name]
    zones = [s.inputs["availabilityZone"] for s in subnets]
    # The first three zones (by name) offering the system type; the GPU zone is one of them here.
    assert sorted(zones) == [f"{region}a", f"{region}b", f"{region}c"]


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
    (
        {"endpointPublicAccess": "false"},
        "endpointPublicAccessCidrs",
        "which endpointPublicAccess = false turns off",
    ),
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


# Kubernetes objects whose pods are not the program's own: the charts' (their values only), and the
# CRDs' schemas (KubeRay's).
THIRD_PARTY = {"kubernetes:helm.sh/v3:Release", "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"}


def pod_specs(value: object) -> Iterator[dict]:
    """Every pod spec (a mapping with a list of `containers`) anywhere in a resource's inputs."""
    if isinstance(value, dict):
        if isinstance(value.get("containers"), list):
            yield value
        for child in value.values():
            yield from pod_specs(child)
    elif isinstance(value, list):
        for child in value:
            yield from pod_specs(child)


def gpu_handed_unasked(inputs: dict) -> list[str]:
    """The containers that ask for no GPU but do not tell the NVIDIA runtime to hand them none."""
    return [
        container["name"]
        for spec in pod_specs(inputs)
        for container in [*spec["containers"], *spec.get("initContainers", [])]
        if GPU_RESOURCE not in container.get("resources", {}).get("limits", {})
        and NO_GPU_ENV not in container.get("env", [])
    ]


def test_every_container_that_asks_for_no_gpu_is_handed_none(stack_plan):
    """The GPU nodes' default runtime is NVIDIA's and the Ray image sets NVIDIA_VISIBLE_DEVICES=all,
    so each container of the program's own pods without a GPU limit sets `NO_GPU_ENV`."""
    _, plan = stack_plan
    own = [r for r in plan.resources if r.type.startswith("kubernetes:") and r.type not in THIRD_PARTY]
    assert {c["name"] for r in own for spec in pod_specs(r.inputs) for c in spec["containers"]} == {
        "ray-head",
        "ray-worker",
        "reader",
    }
    assert {r.name: gpu_handed_unasked(r.inputs) for r in own if gpu_handed_unasked(r.inputs)} == {}
    reader = copy.deepcopy(plan.one("kubernetes:apps/v1:DaemonSet").inputs)
    reader["spec"]["template"]["spec"]["containers"][0]["env"].remove(NO_GPU_ENV)
    assert gpu_handed_unasked(reader) == ["reader"]


def test_no_training_run_when_train_is_off():
    plan = run_program(dev_config(train="false"), FakeAws(region="us-east-2"))
    assert plan.of_type(TRAINING_RUN) == []


def test_the_benchmark_output_is_exported_only_with_benchmark_on():
    """The EFA run beside the TCP baseline, the keys `RunOutputs` declares for it, in their order."""
    on = run_program(dev_config(benchmark="true"), FakeAws(region="us-east-2"))
    assert list(on.outputs["benchmark"]) == [
        "efaTokensPerS",
        "efaBytes",
        "efaBusbwGbps",
        "tcpTransport",
        "tcpTokensPerS",
        "tcpEfaBytes",
        "tcpBusbwGbps",
        "efaSpeedup",
    ]
    off = run_program(dev_config(benchmark="false"), FakeAws(region="us-east-2"))
    assert "benchmark" not in off.outputs


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
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
        "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",  # the VPC CNI's own role's (test_cluster.py)
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
    bucket_key = f"arn:aws:service:{config['aws:region']}:{ACCOUNT}:key/checkpoints"
    assert all(bucket in resource for resource in resources - {bucket_key})
    service_account = plan.one("kubernetes:core/v1:ServiceAccount").inputs
    assert service_account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    # Tokens of an hour, not the webhook's default day (amazon-eks-pod-identity-webhook README).
    assert service_account["metadata"]["annotations"]["eks.amazonaws.com/token-expiration"] == "3600"


@pytest.mark.slow
def test_the_program_needs_neither_torch_nor_ray():
    """`pulumi up` installs requirements.txt only: the program must not import the training stack."""
    import subprocess
    import sys

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


def test_an_image_tag_is_warned_with_how_to_pin_its_digest(monkeypatch):
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    run_program(dev_config(), FakeAws(region="us-east-2"))
    tagged = [warning for warning in warnings if warning.startswith("config key 'image'")]
    assert len(tagged) == 1 and "docker buildx imagetools inspect" in tagged[0] and "crane" not in tagged[0]
    assert (
        "pulumi config set image public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1@sha256:<digest>"
        in tagged[0]
    )
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


def images_run(plan) -> dict[str, str]:
    """Each image the plan runs: the Ray pods', the EFA counter reader's and each Helm release's."""
    spec = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]
    reader = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters").inputs["spec"]["template"]["spec"]
    return {
        "head": spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
        "workers": spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"],
        "reader": reader["containers"][0]["image"],
        **{
            release.inputs[
                "chart"
            ]: f"{release.inputs['values']['image']['repository']}:{release.inputs['values']['image']['tag']}"
            for release in plan.of_type("kubernetes:helm.sh/v3:Release")
        },
    }


def us_east_1_without_a_digest(image: str | None = None) -> dict[str, str]:
    """The us-east-1 stack file as a newcomer sets it: the default image's tag, or `image`."""
    config = config_of(ROOT / "Pulumi.us-east-1.yaml")
    config.pop("eks-ray-train:image")
    return {**config, **({"eks-ray-train:image": image} if image else {})}


@pytest.mark.parametrize("image", [None, "rayproject/ray:2.58.0-py311-gpu"], ids=["default", "tagged"])
def test_a_stack_that_is_not_dev_runs_every_image_by_the_digest_its_registry_names(image, monkeypatch):
    """Issue 60: no digest set by hand; the preview reads each tag's from its registry and names it."""
    logged: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: logged.append(message))
    ray = image or DEFAULT_IMAGE
    with serving_the_program(ray, *the_programs_images("us-east-1")) as registries:
        digests = {
            reference: registries.push(reference)
            for reference in [ray, *the_programs_images("us-east-1")[1:]]
        }
        plan = run_program(us_east_1_without_a_digest(image), FakeAws(region="us-east-1"), stack="us-east-1")
    run = images_run(plan)
    assert {run["head"], run["workers"], run["reader"]} == {f"{ray}@{digests[ray]}"}
    charts = {
        chart: reference for chart, reference in run.items() if chart not in ("head", "workers", "reader")
    }
    assert sorted(charts.values()) == sorted(
        f"{reference}@{digests[reference]}" for reference in digests if reference != ray
    )
    assert plan.outputs["images"] == {"digests": digests}
    pinned = [line for line in logged if ": pinned to sha256:" in line]
    assert len(pinned) == 4 and all("\n" not in line for line in pinned)
    assert pinned[0] == (
        f"config key 'image' = {ray!r}: pinned to {digests[ray]}, read from "
        f"{'public.ecr.aws' if image is None else 'registry-1.docker.io'} at this preview; later `pulumi up`s keep "
        "it (`pulumi config set repinImages <date>` reads every tag anew)"
    )
    assert registries.record_reads == []  # no cluster runs yet: nothing recorded to keep


def test_a_dev_stack_runs_the_tags_and_asks_no_registry():
    with serving_the_program() as registries:
        plan = run_program(us_east_1_without_a_digest(), FakeAws(region="us-east-1"), stack="dev-us-east-1")
    assert "@" not in "".join(images_run(plan).values()) and "images" not in plan.outputs
    assert registries.manifest_requests() == [] and registries.record_reads == []


@pytest.mark.parametrize(
    "image, answer",
    [
        (
            "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v9.9",
            "public.ecr.aws has no tag train-ml-cuda-v9.9",
        ),
        ("registry.example.com/team/ray:2.58.0", "the preview could not read the digest of tag 2.58.0"),
    ],
    ids=["unknown-tag", "unreachable"],
)
def test_an_image_whose_digest_cannot_be_read_stops_the_preview_in_one_line(image, answer):
    with serving_the_program(*the_programs_images("us-east-1")), pytest.raises(pulumi.RunError) as raised:
        run_program(us_east_1_without_a_digest(image), FakeAws(region="us-east-1"), stack="us-east-1")
    refusal = str(raised.value)
    assert refusal.startswith(f"config key 'image' = {image!r}: {answer}") and "\n" not in refusal, refusal
    assert raised.value.plan.resources == []


def test_a_digest_other_than_sha256_is_refused_outside_dev():
    image = "public.ecr.aws/deep-learning-containers/ray@sha512:" + "0" * 128
    with pytest.raises(pulumi.RunError) as raised:
        run_program(us_east_1_without_a_digest(image), FakeAws(region="us-east-1"), stack="us-east-1")
    refusal = str(raised.value)
    assert "has a digest other than sha256" in refusal and "stack 'us-east-1' is not a dev stack" in refusal
    assert "crane" not in refusal and raised.value.plan.resources == []
