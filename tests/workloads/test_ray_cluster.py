"""The RayCluster component in the program's plan: what it waits for, its pods closed to other\nnamespaces and their namespace denying by default, its token authentication, a changed image reaching new pods."""

from __future__ import annotations

from tests.harness.fake_aws import (
    FakeAws,
)
from tests.harness.preview_queries import (
    OBJECT_IDENTITY,
    RAY_CLUSTER,
    TRAINING_RUN,
    engine_step,
    gpu_group,
    subnet_with_id,
)
from tests.harness.program import (
    dev_config,
    run_program,
)
from workloads import manifests

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DISRUPTION_BUDGET = "kubernetes:policy/v1:PodDisruptionBudget"


def test_ray_cluster_waits_for_operator_and_both_device_plugins(stack_plan):
    _, plan = stack_plan
    ray_cluster = plan.one("kubernetes:ray.io/v1:RayCluster")
    release_urns = {r.urn for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert len(release_urns) == 3 and release_urns <= set(ray_cluster.dependencies)
    worker = ray_cluster.inputs["spec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == 2 and worker["rayStartParams"]["num-gpus"] == "4"
    assert ray_cluster.inputs["spec"]["rayVersion"] == "2.58.0"


def test_ray_pods_are_closed_and_their_namespace_denies_by_default_before_they_start(stack_plan):
    """The Ray pods' policy, then the namespace's default deny, then the RayCluster (the manifests'
    rules are judged in tests/workloads/manifests/test_network_policy.py)."""
    config, plan = stack_plan
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    pods_policy = plan.one(NETWORK_POLICY, "ray-train-pods")
    default_deny = plan.one(NETWORK_POLICY, f"{namespace}-default-deny")
    assert {r.name for r in plan.of_type(NETWORK_POLICY)} == {pods_policy.name, default_deny.name}
    for policy in (pods_policy, default_deny):
        assert plan.ancestors(policy)[0] == "eks-ray-train:workloads:RayCluster"
        assert policy.inputs["metadata"]["namespace"] == namespace
        assert policy.urn in plan.one(RAY_CLUSTER).dependencies
    assert pods_policy.urn in default_deny.dependencies
    assert pods_policy.inputs["spec"]["podSelector"] == {"matchLabels": {"ray.io/cluster": "ray-train"}}
    assert default_deny.inputs["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    # The counter reader's rule names the GPU subnet, the one the GPU node group is in.
    [gpu_subnet_id] = gpu_group(plan).inputs["subnetIds"]
    gpu_subnet = subnet_with_id(plan, gpu_subnet_id)
    reader_rule = pods_policy.inputs["spec"]["egress"][-1]
    assert reader_rule["to"] == [{"ipBlock": {"cidr": gpu_subnet.inputs["cidrBlock"]}}]
    # Enforced only with the VPC CNI's network policy agent on.
    assert plan.one("eks:index:VpcCniAddon").inputs["enableNetworkPolicy"] is True
    labels = plan.one("kubernetes:core/v1:Namespace", namespace).inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"


def test_the_head_is_held_against_evictions_before_its_pod_exists(stack_plan):
    """The head's PodDisruptionBudget beside the RayCluster, in its namespace, created before it; the
    head's pod template keeps a cluster autoscaler off its node (the manifests are judged in
    tests/workloads/manifests/test_head_disruption_budget.py)."""
    config, plan = stack_plan
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    budget = plan.one(DISRUPTION_BUDGET)
    assert plan.ancestors(budget)[0] == "eks-ray-train:workloads:RayCluster"
    assert budget.inputs["metadata"]["namespace"] == namespace
    assert budget.urn in plan.one(RAY_CLUSTER).dependencies
    assert budget.inputs["spec"]["maxUnavailable"] == 0
    assert budget.inputs["spec"]["selector"] == {"matchLabels": manifests.head_pod_labels("ray-train")}
    head = plan.one(RAY_CLUSTER).inputs["spec"]["headGroupSpec"]["template"]
    assert head["metadata"]["annotations"][manifests.SAFE_TO_EVICT_ANNOTATION] == "false"


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


def test_ray_token_authentication_is_on_and_its_token_stays_out_of_the_stack(stack_plan):
    """KubeRay creates the token's Secret (named after the RayCluster) and wires it into the pods;
    the program declares only the mode, so no token is in a resource's inputs, the state or an output."""
    config, plan = stack_plan
    ray_cluster = plan.one(RAY_CLUSTER)
    assert ray_cluster.inputs["spec"]["authOptions"] == {"mode": "token"}
    secrets = plan.of_type("kubernetes:core/v1:Secret")
    assert [secret.inputs["metadata"]["name"] for secret in secrets] in ([], [manifests.HF_TOKEN_SECRET])
    # The dashboard's output says how to read the token, never the token.
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    reading = manifests.ray_auth_token_command(ray_cluster.inputs["metadata"]["name"], namespace)
    assert reading in plan.outputs["rayDashboard"]
