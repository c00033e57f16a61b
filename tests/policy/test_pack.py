"""The pack as a whole: its copies of the program's contract equal the originals, and every resource
of every stack's mocks run passes every mandatory rule (its entry point: test___main__.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pulumi
import pytest
from pulumi_policy import (
    EnforcementLevel,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

import platform_contract
from infra.aws_rules.live_stack import control_plane_log_group
from infra.resources import irsa, keys
from infra.resources.cluster import NODE_POLICIES, VPC_CNI_POLICY, VPC_CNI_SERVICE_ACCOUNT
from infra.resources.node_groups import METADATA_OPTIONS
from policy.rules import eks, iam, kms, nodes, pods, properties, ray, registered, registry, storage
from policy.rules.properties import StackResource
from tests.harness.policy_resources import (
    EKS,
    LT,
    NG,
    NS,
    RAY,
)
from tests.harness.program import (
    STACK_FILES,
    USER_SETTINGS,
    Preview,
    config_of,
    dev_config,
    fake_outputs,
    run_program,
    stack_name,
)
from workloads import manifests
from workloads.manifests import ray_service_account

DEFINED_RULES = registered()
VERSIONING = properties.BUCKET_VERSIONING[0]


RESOURCE_RULES = [rule for rule in DEFINED_RULES if isinstance(rule, registry.ResourceRule)]


STACK_RULES = [rule for rule in DEFINED_RULES if isinstance(rule, registry.StackRule)]


@pytest.mark.parametrize(
    "stack", ["dev", "dev-alice", "alice-dev", "devices", "prod-dev2", "us-east-1", "develop"]
)
def test_pack_dev_stacks_are_the_programs(stack):
    assert properties.is_dev_stack(stack) == platform_contract.is_dev_stack(stack)


def test_pack_constants_match_the_program():
    assert ray.RAY_PORTS == platform_contract.RAY_PORTS
    assert ray.RAY_CLUSTER_LABEL == manifests.RAY_CLUSTER_LABEL
    assert ray.RAY_NODE_TYPE_LABEL == manifests.RAY_NODE_TYPE_LABEL
    assert manifests.POD_SECURITY_LABELS[pods.POD_SECURITY_ENFORCE] in pods.ENFORCED_LEVELS
    assert manifests.KUBERAY_POD_SECURITY_LABELS[pods.POD_SECURITY_ENFORCE] in pods.ENFORCED_LEVELS
    assert pods.KUBE_SYSTEM == manifests.KUBE_SYSTEM
    assert manifests.KUBERAY_OPERATOR.name == ray.KUBERAY_CHART
    assert manifests.kuberay_operator_values("n")[ray.NAMESPACE_SCOPED_VALUE] is True
    assert METADATA_OPTIONS["http_put_response_hop_limit"] == nodes.POD_SAFE_HOP_LIMIT
    assert storage.control_plane_log_group("c") == control_plane_log_group("c")
    key, value = nodes.GPU_NODE_LABEL
    assert platform_contract.GPU_LABELS[key] == value
    assert {key: value} == platform_contract.GPU_NODE_SELECTOR
    assert iam.STS_AUDIENCE == irsa.STS_AUDIENCE
    assert iam.ROLE_ARN_ANNOTATION == ray_service_account.ROLE_ARN_ANNOTATION
    assert iam.TOKEN_EXPIRATION_ANNOTATION == ray_service_account.TOKEN_EXPIRATION_ANNOTATION
    assert iam.TOKEN_EXPIRATION_MAX_S == ray_service_account.TOKEN_EXPIRATION_S
    assert kms.MIN_DELETION_WINDOW_DAYS == keys.DELETION_WINDOW_DAYS
    assert eks.VPC_CNI_SERVICE_ACCOUNT == VPC_CNI_SERVICE_ACCOUNT
    forbidden = [f":{policy}" for policy in nodes.NODE_ROLE_FORBIDDEN]
    assert VPC_CNI_POLICY.endswith(forbidden[0])
    assert not any(arn.endswith(policy) for arn in NODE_POLICIES for policy in forbidden)


@pytest.fixture(scope="module", params=STACK_FILES, ids=stack_name)
def stack_plan(request) -> tuple[str, Preview]:
    stack = stack_name(request.param)
    return stack, run_program(config_of(request.param), stack=stack)


def stack_resources(plan: Preview) -> list[StackResource]:
    return [StackResource(r.type, r.urn, r.inputs, tuple(r.dependencies)) for r in plan.resources]


def violations_of(resources: list[StackResource], stack: str) -> list[str]:
    """What every mandatory rule reports on the resources, each as `<rule> on <resource>: <message>`."""
    found = [
        f"{rule.name} on {r.urn}: {message}"
        for rule in RESOURCE_RULES
        if rule.enforcement is EnforcementLevel.MANDATORY
        for r in resources
        for message in rule.check(r.type, r.props, stack)
    ]
    found += [
        f"{rule.name} on {urn}: {message}"
        for rule in STACK_RULES
        if rule.enforcement is EnforcementLevel.MANDATORY
        for urn, message in rule.check(resources)
    ]
    return found


def mandatory_violations(plan: Preview, stack: str) -> list[str]:
    return violations_of(stack_resources(plan), stack)


def as_the_engine_shows(value: Any) -> Any:
    """Inputs with the SDK's unknowns (a first preview's) as the engine shows them to a policy: sentinels."""
    if isinstance(value, pulumi.output.Unknown):
        return UNKNOWN_STRING_VALUE
    if isinstance(value, dict):
        return {key: as_the_engine_shows(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_the_engine_shows(item) for item in value]
    return value


def as_an_update_shows(plan: Preview) -> list[StackResource]:
    """The stack's AWS resources as a stack policy sees them in the preview of an update, where they
    exist: their outputs (the mocks' ARN, name and id) known beside their inputs."""
    # The region the program ran in, as the S3 endpoint's service names it (com.amazonaws.<region>.s3).
    region = plan.one(properties.VPC_ENDPOINT).inputs["serviceName"].split(".")[2]

    def outputs(r) -> dict[str, Any]:
        if not r.type.startswith("aws:"):
            return {}
        return {
            **fake_outputs(pulumi.runtime.MockResourceArgs(r.type, r.name, r.inputs), region),
            "id": f"{r.name}-id",
        }

    return [
        StackResource(r.type, r.urn, {**r.inputs, **outputs(r)}, tuple(r.dependencies))
        for r in plan.resources
    ]


def test_every_stack_passes_every_mandatory_rule(stack_plan):
    stack, plan = stack_plan
    assert mandatory_violations(plan, stack) == []


def test_every_stack_passes_every_mandatory_rule_in_its_first_preview():
    """Where every output the program reads back is unknown: the rules leave what they cannot know,
    the IAM roles' ARNs and the S3 endpoint's id included, to a later run."""
    for stack_file in STACK_FILES:
        stack = stack_name(stack_file)
        plan = run_program(config_of(stack_file), stack=stack, first_preview=True)
        resources = [
            StackResource(r.type, r.urn, as_the_engine_shows(r.inputs), tuple(r.dependencies))
            for r in plan.resources
        ]
        assert violations_of(resources, stack) == [], stack


def test_every_stack_passes_every_mandatory_rule_as_an_update_previews_it(stack_plan):
    """With the roles' ARNs and the endpoint's id known, the bucket policy's denial is matched with
    them, not taken on its dependencies."""
    stack, plan = stack_plan
    resources = as_an_update_shows(plan)
    assert violations_of(resources, stack) == []
    [pods_role] = [
        r for r in resources if r.type == properties.ROLE and r.props["name"].endswith("-ray-pods")
    ]
    [policy] = [r for r in resources if r.type == properties.BUCKET_POLICY]
    document = json.loads(policy.props["policy"])
    [deny] = [s for s in document["Statement"] if s.get("Sid") == "RayPodsOnlyThroughTheVpcEndpoint"]
    assert deny["Condition"]["ArnEquals"]["aws:PrincipalArn"] == pods_role.props["arn"]

    def broken(change) -> list[str]:
        edited = copy.deepcopy(document)
        change(next(s for s in edited["Statement"] if s.get("Sid") == "RayPodsOnlyThroughTheVpcEndpoint"))
        props = {**policy.props, "policy": json.dumps(edited)}
        return violations_of(
            [
                r if r is not policy else StackResource(r.type, r.urn, props, r.dependencies)
                for r in resources
            ],
            stack,
        )

    # A typo in the role's ARN, and another endpoint's id: each the bucket policy still depends on.
    typo = broken(
        lambda s: s["Condition"]["ArnEquals"].update({"aws:PrincipalArn": pods_role.props["arn"] + "s"})
    )
    assert [v.split(" on ", 1)[0] for v in typo] == ["s3-buckets-vpc-endpoint-only"], typo
    assert f"not to role {pods_role.props['arn']}, which the stack allows on the bucket" in typo[0]
    elsewhere = broken(
        lambda s: s["Condition"]["StringNotEquals"].update({"aws:SourceVpce": "vpce-0elsewhere"})
    )
    assert [v.split(" on ", 1)[0] for v in elsewhere] == ["s3-buckets-vpc-endpoint-only"], elsewhere
    assert "requires vpce-0elsewhere, which is no S3 gateway endpoint of the stack" in elsewhere[0]


def test_the_dev_stack_with_its_crds_full_schemas_passes_every_mandatory_rule():
    """KubeRay's CRD schemas name `containers` as a property (the mocks' runs leave the schemas out):
    a preview sees them in full, and none reads as a pod template without a namespace."""
    plan = run_program({**dev_config(), **USER_SETTINGS}, crd_schemas=True)
    assert mandatory_violations(plan, "dev") == []


def test_every_stack_sends_all_control_plane_logs(stack_plan):
    stack, plan = stack_plan
    cluster = plan.one(EKS)
    assert eks.control_plane_logging.check(cluster.type, cluster.inputs, stack) == []
    group = plan.one(properties.LOG_GROUP)
    assert storage.log_groups_kms_encrypted.check(group.type, group.inputs, stack) == []


def test_mandatory_rules_catch_breakage_in_the_programs_own_resources(stack_plan):
    """The rules read the property names the program really registers: break each, one is reported."""
    stack, plan = stack_plan
    gpu_group_ = next(r for r in plan.of_type(NG) if nodes.is_gpu_node_group(r.inputs))
    gpu_template = next(r for r in plan.of_type(LT) if r.urn in gpu_group_.dependencies)
    cluster = plan.one(EKS)
    ray = plan.one(RAY)
    tls_policy = plan.one(properties.BUCKET_POLICY)
    control_plane_logs = plan.one(properties.LOG_GROUP)
    versioning = plan.one(VERSIONING)
    default_sg = plan.one(properties.DEFAULT_SECURITY_GROUP)
    ray_namespace = plan.one(NS, "ray-train")
    ray_pods_policy = plan.one(properties.NETWORK_POLICY, "ray-train-pods")
    default_deny = plan.one(properties.NETWORK_POLICY, "ray-train-default-deny")
    reader_daemonset = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters")
    reader_namespace_name = reader_daemonset.inputs["metadata"]["namespace"]
    kuberay_release = plan.one("kubernetes:helm.sh/v3:Release", manifests.KUBERAY_OPERATOR.name)
    cluster_name = cluster.inputs["name"]
    agent_policy = plan.one(properties.ROLE_POLICY_ATTACHMENT, "observability-agent")
    pull_only = next(
        r for r in plan.of_type(properties.ROLE_POLICY_ATTACHMENT) if r.name.endswith("PullOnly")
    )
    vpc_cni = plan.one(properties.PULUMI_EKS_VPC_CNI)
    cni_role = plan.one(properties.ROLE, f"{cluster_name}-vpc-cni")
    ray_service_account = plan.one(properties.SERVICE_ACCOUNT)
    pods_access = plan.one(properties.ROLE_POLICY, "checkpoints-ray-pods")
    pods_role = plan.one(properties.ROLE, "checkpoints-ray-pods")
    node_role = plan.one(properties.ROLE, f"{cluster_name}-node")
    bucket_arn = f"arn:aws:s3:::{plan.one(properties.BUCKETS[0]).inputs['bucket']}"
    s3_endpoint = plan.one(properties.VPC_ENDPOINT)
    bucket_encryption = plan.one(properties.BUCKET_ENCRYPTION[0])
    bucket_key = plan.one(properties.KMS_KEY, "checkpoints")
    cluster_key = plan.one(properties.KMS_KEY, f"{cluster_name}-secrets")

    def broken(registration, change) -> list[str]:
        original = registration.inputs
        registration.inputs = copy.deepcopy(original)
        change(registration.inputs)
        try:
            return mandatory_violations(plan, stack)
        finally:
            registration.inputs = original

    def worker(inputs: dict) -> dict:
        return inputs["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]

    def in_document(key: str, change):
        """Change the policy document (JSON text) at `key` of the inputs."""

        def edit(inputs: dict) -> None:
            document = json.loads(inputs[key])
            change(document)
            inputs[key] = json.dumps(document)

        return edit

    def statement(document: dict, sid: str) -> dict:
        return next(s for s in document["Statement"] if s.get("Sid") == sid)

    def subject_as_a_pattern(condition: dict) -> None:
        """The trust's :sub moved from StringEquals to a StringLike pattern of its namespace."""
        [subject] = [key for key in condition["StringEquals"] if key.endswith(":sub")]
        namespace = condition["StringEquals"].pop(subject).rsplit(":", 1)[0]
        condition["StringLike"] = {subject: f"{namespace}:*"}

    breakages = {
        "imdsv2-required": (gpu_template, lambda p: p["metadataOptions"].update(httpTokens="optional")),
        "nodes-without-public-ips": (
            gpu_template,
            lambda p: p["networkInterfaces"][0].update(associatePublicIpAddress="true"),
        ),
        "gpu-node-group-efa-interface": (
            gpu_template,
            lambda p: [i.update(interfaceType="interface") for i in p["networkInterfaces"]],
        ),
        "gpu-node-group-single-subnet": (gpu_group_, lambda p: p["subnetIds"].append("subnet-elsewhere")),
        "eks-secrets-kms-encrypted": (cluster, lambda p: p.pop("encryptionConfigKeyArn")),
        "eks-api-not-open-to-internet": (
            cluster,
            lambda p: p.update(endpointPublicAccess=True, publicAccessCidrs=["0.0.0.0/0"]),
        ),
        "ray-ports-not-exposed": (
            ray,
            lambda p: p["spec"]["headGroupSpec"].update(serviceType="LoadBalancer"),
        ),
        "ray-worker-requests-equal-limits": (
            ray,
            lambda p: worker(p)["resources"]["requests"].update(cpu="1"),
        ),
        "container-images-pinned": (ray, lambda p: worker(p).update(image="rayproject/ray:latest")),
        "container-images-digest-pinned": (
            ray,
            lambda p: worker(p).update(image="rayproject/ray:2.58.0-gpu"),
        ),
        "ray-pods-without-api-token": (
            ray,
            lambda p: p["spec"]["headGroupSpec"]["template"]["spec"].pop("automountServiceAccountToken"),
        ),
        "metadata-hop-limit-1": (
            gpu_template,
            lambda p: p["metadataOptions"].update(httpPutResponseHopLimit=2),
        ),
        "s3-buckets-tls-only": (
            tls_policy,
            in_document("policy", lambda d: d["Statement"].remove(statement(d, "DenyRequestsWithoutTls"))),
        ),
        "log-retention-set": (control_plane_logs, lambda p: p.pop("retentionInDays")),
        "s3-buckets-versioned": (
            versioning,
            lambda p: p["versioningConfiguration"].update(status="Suspended"),
        ),
        "vpc-default-security-group-closed": (
            default_sg,
            lambda p: p.update(egress=[{"protocol": "-1", "cidrBlocks": ["0.0.0.0/0"]}]),
        ),
        "namespace-pod-security-enforced": (
            ray_namespace,
            lambda p: p["metadata"]["labels"].pop(pods.POD_SECURITY_ENFORCE),
        ),
        "namespace-pod-security-enforced (host network)": (
            reader_daemonset,
            lambda p: p["spec"]["template"]["spec"].update(hostPID=True),
        ),
        "namespace-pod-security-enforced (reader's hardening)": (
            reader_daemonset,
            lambda p: p["spec"]["template"]["spec"].pop("automountServiceAccountToken"),
        ),
        "namespace-pod-security-enforced (reader's AppArmor annotation)": (
            reader_daemonset,
            lambda p: p["spec"]["template"]["metadata"].update(
                annotations={"container.apparmor.security.beta.kubernetes.io/reader": "unconfined"}
            ),
        ),
        "namespace-pod-security-enforced (pod template without a namespace)": (
            reader_daemonset,
            lambda p: p["metadata"].pop("namespace"),
        ),
        "namespace-pod-security-enforced (Helm release into the reader's namespace)": (
            kuberay_release,
            lambda p: p.update(namespace=reader_namespace_name),
        ),
        "helm-namespaces-declared": (kuberay_release, lambda p: p.update(createNamespace=True)),
        "helm-namespaces-declared (undeclared namespace)": (
            kuberay_release,
            lambda p: p.update(namespace="kuberay-system"),
        ),
        "kuberay-operator-namespace-scoped": (
            kuberay_release,
            lambda p: p["values"].update(singleNamespaceInstall=False),
        ),
        "ray-pods-network-policy": (ray_pods_policy, lambda p: p["spec"].update(ingress=[{}])),
        "ray-pods-network-policy (every namespace)": (
            ray_pods_policy,
            lambda p: p["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}}),
        ),
        "ray-pods-network-policy (every address)": (
            ray_pods_policy,
            lambda p: p["spec"]["ingress"][0]["from"].append({"ipBlock": {"cidr": "0.0.0.0/0"}}),
        ),
        "ray-namespace-default-deny": (default_deny, lambda p: p["spec"].update(policyTypes=["Ingress"])),
        "ray-namespace-default-deny (egress everywhere)": (
            ray_pods_policy,
            lambda p: p["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}),
        ),
        "ray-namespace-default-deny (HTTPS widened to a range of every port)": (
            ray_pods_policy,
            lambda p: [
                port.update(port=1, endPort=65535)
                for rule in p["spec"]["egress"]
                for port in rule.get("ports", [])
                if port.get("port") == 443
            ],
        ),
        "ray-pods-network-policy (every Ray pod opened by KubeRay's own label)": (
            ray_pods_policy,
            lambda p: p["spec"].update(
                podSelector={"matchLabels": {"ray.io/is-ray-node": "yes"}},
                ingress=[{"from": [{"namespaceSelector": {}}]}],
            ),
        ),
        "node-role-least-privilege": (
            pull_only,
            lambda p: p.update(policyArn="arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"),
        ),
        "node-role-least-privilege (the CNI policy back on the node role)": (
            pull_only,
            lambda p: p.update(policyArn="arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"),
        ),
        "vpc-cni-irsa": (vpc_cni, lambda p: p.pop("serviceAccountRoleArn")),
        "vpc-cni-irsa (the cluster's own add-on, without a role)": (
            cluster,
            lambda p: p.pop("useDefaultVpcCni"),
        ),
        "irsa-trust-scoped": (
            cni_role,
            in_document(
                "assumeRolePolicy",
                lambda d: [
                    conditions.pop(key)
                    for conditions in [d["Statement"][0]["Condition"]["StringEquals"]]
                    for key in list(conditions)
                    if key.endswith(":aud")
                ],
            ),
        ),
        "irsa-trust-scoped (a subject pattern)": (
            cni_role,
            in_document("assumeRolePolicy", lambda d: subject_as_a_pattern(d["Statement"][0]["Condition"])),
        ),
        "irsa-token-lifetime": (
            ray_service_account,
            lambda p: p["metadata"]["annotations"].pop("eks.amazonaws.com/token-expiration"),
        ),
        "s3-access-prefix-scoped": (
            pods_access,
            in_document(
                "policy",
                lambda d: statement(d, "ReadAndWriteTheRuns").update(
                    Resource=[statement(d, "ListTheJobsPrefixes")["Resource"] + "/*"]
                ),
            ),
        ),
        "s3-access-prefix-scoped (listing the whole bucket)": (
            pods_access,
            in_document("policy", lambda d: statement(d, "ListTheJobsPrefixes").pop("Condition")),
        ),
        "s3-access-prefix-scoped (every action but IAM's)": (
            pods_access,
            in_document(
                "policy",
                lambda d: d["Statement"].append(
                    {"Effect": "Allow", "NotAction": "iam:*", "Resource": f"{bucket_arn}/*"}
                ),
            ),
        ),
        "s3-access-prefix-scoped (AmazonS3ReadOnlyAccess on the pods' role)": (
            pods_role,
            lambda p: p.update(managedPolicyArns=["arn:aws:iam::aws:policy/AmazonS3ReadOnlyAccess"]),
        ),
        "iam-no-wide-managed-policies": (
            pods_role,
            lambda p: p.update(managedPolicyArns=["arn:aws:iam::aws:policy/AmazonEC2FullAccess"]),
        ),
        "iam-no-wide-managed-policies (the CloudWatch agent's role)": (
            agent_policy,
            lambda p: p.update(policyArn="arn:aws:iam::aws:policy/AdministratorAccess"),
        ),
        "s3-buckets-vpc-endpoint-only": (
            tls_policy,
            in_document(
                "policy", lambda d: d["Statement"].remove(statement(d, "RayPodsOnlyThroughTheVpcEndpoint"))
            ),
        ),
        "s3-buckets-vpc-endpoint-only (an endpoint on no route table)": (
            s3_endpoint,
            lambda p: p.update(routeTableIds=[]),
        ),
        "s3-buckets-vpc-endpoint-only (the node role allowed on the bucket, which the denial leaves out)": (
            node_role,
            lambda p: p.update(
                inlinePolicies=[
                    {
                        "name": "runs",
                        "policy": json.dumps(
                            {
                                "Statement": [
                                    {
                                        "Effect": "Allow",
                                        "Action": "s3:GetObject",
                                        "Resource": f"{bucket_arn}/runs/*",
                                    }
                                ]
                            }
                        ),
                    }
                ]
            ),
        ),
        "s3-buckets-kms-cmk": (
            bucket_encryption,
            lambda p: p["rules"][0]["applyServerSideEncryptionByDefault"].pop("kmsMasterKeyId"),
        ),
        "kms-key-deletion-window": (bucket_key, lambda p: p.update(deletionWindowInDays=7)),
        "kms-key-deletion-window (the cluster's key)": (
            cluster_key,
            lambda p: p.update(deletionWindowInDays=7),
        ),
        "kms-key-rotation": (bucket_key, lambda p: p.update(enableKeyRotation=False)),
        "kms-key-use-bound": (
            bucket_key,
            in_document("policy", lambda d: statement(d, "RayPodsThroughS3").pop("Condition")),
        ),
    }
    mandatory = {rule.name for rule in DEFINED_RULES if rule.enforcement is EnforcementLevel.MANDATORY}
    assert {name.split(" (")[0] for name in breakages} == mandatory
    # Breakages that more than their own rule refuses: AdministratorAccess allows S3 on every bucket,
    # to a role the bucket policy's denial does not name.
    also = {
        "iam-no-wide-managed-policies (the CloudWatch agent's role)": [
            "s3-access-prefix-scoped",
            "s3-buckets-vpc-endpoint-only",
        ]
    }
    runs_tags = platform_contract.is_dev_stack(stack)
    for case, (registration, change) in breakages.items():
        rule_name = case.split(" (")[0]
        violations = broken(registration, change)
        expected = [rule_name, *also.get(case, [])]
        if rule_name == "container-images-digest-pinned" and runs_tags:
            expected = []  # a dev stack may run a tag
        if rule_name == "container-images-pinned" and not runs_tags:
            expected.append("container-images-digest-pinned")  # latest is no digest either
        assert sorted(v.split(" on ", 1)[0] for v in violations) == sorted(expected), (case, violations)
