"""The cluster: its access entries (which caller counts as a listed principal), the add-on versions it
keeps, and in the program's plan its settings, kubeconfig, credentials, CoreDNS and control plane logs;
the vpc-cni add-on's alias and the state rewrite UPGRADING.md gives for stacks older than it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pulumi
import pytest

from infra.resources.cluster import (
    KUBE_PROXY_ADDON,
    NODE_POLICIES,
    VPC_CNI_ADDON,
    VPC_CNI_POLICY,
    kept_addon_version,
    names_same_principal,
)
from tests.harness.fake_aws import (
    COREDNS_VERSIONS,
    KUBE_PROXY_VERSIONS,
    VPC_CNI_VERSIONS,
    FakeAws,
)
from tests.harness.paths import REPO_ROOT
from tests.harness.program import (
    ACCOUNT,
    STACK_FILES,
    Preview,
    addon_versions,
    config_of,
    deployed,
    dev_config,
    run_program,
)


@pytest.mark.parametrize(
    "caller, principal, same",
    [
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:user/alice", True),
        (
            "arn:aws:sts::123456789012:assumed-role/ci-deployer/gh-run-7",
            "arn:aws:iam::123456789012:role/platform/ci-deployer",
            True,
        ),
        (
            "arn:aws:sts::123456789012:assumed-role/ci-deployer/gh-run-7",
            "arn:aws:iam::210987654321:role/ci-deployer",
            False,
        ),
        ("arn:aws:iam::123456789012:user/alice", "arn:aws:iam::123456789012:role/alice", False),
    ],
)
def test_the_caller_is_matched_to_a_listed_principal(caller, principal, same):
    assert names_same_principal(caller, principal) is same


NEWEST = "v1.12.4-eksbuild.4"


@pytest.mark.parametrize(
    ("live_version", "live_kubernetes_version", "wanted", "chosen"),
    [
        pytest.param(None, None, "1.34", NEWEST, id="no cluster yet"),
        pytest.param(None, "1.34", "1.34", NEWEST, id="a cluster without the add-on"),
        pytest.param(
            "v1.12.4-eksbuild.3", "1.34", "1.34", "v1.12.4-eksbuild.3", id="kept at the same version"
        ),
        pytest.param("v1.12.4-eksbuild.4", "1.34", "1.34", NEWEST, id="kept, already the newest"),
        pytest.param("v1.12.4-eksbuild.3", "1.34", "1.35", NEWEST, id="kubernetesVersion moves"),
    ],
)
def test_an_addon_keeps_the_live_version_until_kubernetes_version_moves(
    live_version, live_kubernetes_version, wanted, chosen
):
    assert kept_addon_version(live_version, live_kubernetes_version, wanted, NEWEST) == chosen


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
    assert cluster["useDefaultVpcCni"] is True and "vpcCniOptions" not in cluster
    addons = {r.inputs["addonName"] for r in plan.of_type("aws:eks/addon:Addon")}
    assert addons == {"coredns", "amazon-cloudwatch-observability", "eks-node-monitoring-agent"}


def test_kubeconfig_is_secret(stack_plan):
    _, plan = stack_plan
    providers = plan.of_type("pulumi:providers:kubernetes")
    assert sorted(provider.name for provider in providers) == ["eks", "eks-crds"]
    assert all("kubeconfig" in provider.secret_inputs for provider in providers)


def test_coredns_is_pinned_to_the_newest_build_for_the_cluster_version():
    plan = run_program(dev_config(kubernetesVersion="1.34"), FakeAws(region="us-east-2"))
    assert plan.one("aws:eks/addon:Addon", "coredns").inputs["addonVersion"] == COREDNS_VERSIONS["1.34"]
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), FakeAws(region="us-east-2"))
    assert upgraded.one("aws:eks/addon:Addon", "coredns").inputs["addonVersion"] == COREDNS_VERSIONS["1.35"]


def kubeconfig_token_args(plan: Preview) -> list[str]:
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


def test_control_plane_log_group_exists_before_the_cluster_with_a_retention(stack_plan):
    config, plan = stack_plan
    group = plan.one("aws:cloudwatch/logGroup:LogGroup")
    assert group.inputs["name"] == f"/aws/eks/{config['eks-ray-train:clusterName']}/cluster"
    assert group.inputs["retentionInDays"] == 30
    assert group.urn in plan.one("eks:index:Cluster").dependencies


def test_log_retention_is_configurable():
    plan = run_program(dev_config(logRetentionDays="90"), FakeAws(region="us-east-2"))
    assert plan.one("aws:cloudwatch/logGroup:LogGroup").inputs["retentionInDays"] == 90


def test_control_plane_logs_are_encrypted_with_the_cluster_key(stack_plan):
    config, plan = stack_plan
    region, cluster_name = config["aws:region"], config["eks-ray-train:clusterName"]
    key = plan.one("aws:kms/key:Key", f"{cluster_name}-secrets")
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


def test_the_cluster_key_rotates_and_waits_30_days_before_deletion(stack_plan):
    config, plan = stack_plan
    key = plan.one("aws:kms/key:Key", f"{config['eks-ray-train:clusterName']}-secrets").inputs
    assert key["enableKeyRotation"] is True
    assert key["deletionWindowInDays"] == 30


ROLE_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"


def attached_to(plan: Preview, role_name: str) -> set[str]:
    """The managed policies attached to the role (mocked role names are their resource names)."""
    return {r.inputs["policyArn"] for r in plan.of_type(ROLE_ATTACHMENT) if r.inputs["role"] == role_name}


def test_nodes_hold_only_what_a_node_needs(stack_plan):
    config, plan = stack_plan
    node_role = f"{config['eks-ray-train:clusterName']}-node"
    assert attached_to(plan, node_role) == {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    }
    assert set(NODE_POLICIES) == attached_to(plan, node_role)
    assert json.loads(plan.one("aws:iam/role:Role", node_role).inputs["assumeRolePolicy"])["Statement"] == [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ]


def test_the_vpc_cni_runs_as_a_role_of_its_own(stack_plan):
    """aws-node assumes a role trusted for kube-system:aws-node alone, which holds the CNI policy; the
    add-on carries it, keeps the network policy agent on, and keeps pulumi-eks's add-on (its alias)."""
    config, plan = stack_plan
    cluster_name, region = config["eks-ray-train:clusterName"], config["aws:region"]
    role = plan.one("aws:iam/role:Role", f"{cluster_name}-vpc-cni")
    [statement] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    issuer = f"oidc.eks.{region}.amazonaws.com/id/0123456789ABCDEF"
    assert statement["Principal"] == {"Federated": f"arn:aws:iam::{ACCOUNT}:oidc-provider/{issuer}"}
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Condition"] == {
        "StringEquals": {
            f"{issuer}:sub": "system:serviceaccount:kube-system:aws-node",
            f"{issuer}:aud": "sts.amazonaws.com",
        }
    }
    assert attached_to(plan, role.name) == {VPC_CNI_POLICY}
    cni = plan.one("eks:index:VpcCniAddon")
    eks_cluster = plan.one("eks:index:Cluster")
    assert cni.name == f"{cluster_name}-vpc-cni"
    assert cni.inputs["serviceAccountRoleArn"] == f"arn:aws:service:{region}:{ACCOUNT}:role/{role.name}"
    assert cni.inputs["enableNetworkPolicy"] is True
    assert cni.inputs["clusterName"] == cluster_name and cni.inputs["tags"] == {"project": "eks-ray-train"}
    assert eks_cluster.urn in cni.dependencies
    assert plan.ancestors(cni)[0] == "eks-ray-train:infra:Cluster"
    assert eks_cluster.urn in cni.alias_parents
    attachment = next(r for r in plan.of_type(ROLE_ATTACHMENT) if r.inputs["role"] == role.name)
    assert attachment.urn in cni.dependencies
    # A node joins once aws-node can run as its own role.
    for group in plan.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert cni.urn in group.dependencies, group.name


ADDON = "aws:eks/addon:Addon"
GET_ADDON = "aws:eks/getAddon:getAddon"
# Builds EKS publishes after the first deploy.
LATER_VPC_CNI_BUILD = "v1.20.5-eksbuild.1"
LATER_KUBE_PROXY_BUILD = "v1.34.1-eksbuild.1"


def test_no_addon_version_is_left_to_pulumi_eks(stack_plan):
    """Every managed add-on the program makes, or has pulumi-eks make, carries a version: left out,
    pulumi-eks applies the newest build EKS offers at every run."""
    _, plan = stack_plan
    cluster = plan.one("eks:index:Cluster").inputs
    kubernetes_version = cluster["version"]
    assert cluster["corednsAddonOptions"]["enabled"] is False  # the program's own (`install_coredns`)
    kube_proxy = cluster["kubeProxyAddonOptions"]
    assert kube_proxy["enabled"] is True and kube_proxy["version"] == KUBE_PROXY_VERSIONS[kubernetes_version]
    assert plan.one("eks:index:VpcCniAddon").inputs["addonVersion"] == VPC_CNI_VERSIONS[kubernetes_version]
    versions = addon_versions(plan)
    assert {VPC_CNI_ADDON, KUBE_PROXY_ADDON, "coredns"} <= set(versions)
    assert [name for name, version in versions.items() if not version] == []


def pulumi_eks_versions(plan: Preview) -> tuple[str, str]:
    return (
        plan.one("eks:index:VpcCniAddon").inputs["addonVersion"],
        plan.one("eks:index:Cluster").inputs["kubeProxyAddonOptions"]["version"],
    )


@pytest.mark.slow
def test_vpc_cni_and_kube_proxy_keep_the_live_versions_until_kubernetes_version_moves():
    """A build EKS publishes later reaches neither add-on through an unrelated `pulumi up`."""
    fake = FakeAws(region="us-east-2")
    deployed(run_program(dev_config(kubernetesVersion="1.34"), fake), fake)
    assert fake.addons["eks-ray-train"][VPC_CNI_ADDON] == VPC_CNI_VERSIONS["1.34"]
    fake.addon_builds[VPC_CNI_ADDON]["1.34"] = LATER_VPC_CNI_BUILD
    fake.addon_builds[KUBE_PROXY_ADDON]["1.34"] = LATER_KUBE_PROXY_BUILD
    second = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert pulumi_eks_versions(second) == (VPC_CNI_VERSIONS["1.34"], KUBE_PROXY_VERSIONS["1.34"])
    read = [args["addonName"] for token, args in fake.calls if token == GET_ADDON]
    assert {VPC_CNI_ADDON, KUBE_PROXY_ADDON} <= set(read)
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), fake)
    assert pulumi_eks_versions(upgraded) == (VPC_CNI_VERSIONS["1.35"], KUBE_PROXY_VERSIONS["1.35"])
    # A cluster without the add-on (a first `up` that stopped before it) takes the newest.
    del fake.addons["eks-ray-train"][KUBE_PROXY_ADDON]
    again = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert pulumi_eks_versions(again) == (VPC_CNI_VERSIONS["1.34"], LATER_KUBE_PROXY_BUILD)


def child_urn(parent_urn: str, type_token: str, name: str) -> str:
    """The URN of a resource of `type_token` named `name` under `parent_urn` (`urn:pulumi:<stack>::
    <project>::<the parent's types, $-joined>$<type>::<name>`)."""
    stack_and_project, parent_types, _ = parent_urn.rsplit("::", 2)
    return f"{stack_and_project}::{parent_types}${type_token}::{name}"


def pulumi_eks_cni_urns(plan: Preview) -> tuple[str, str]:
    """The URNs of the `VpcCniAddon` pulumi-eks made inside its cluster for a stack deployed before
    issue 53, and of the add-on inside it (pulumi-eks nodejs/eks/cluster/cluster.ts: `new
    VpcCniAddon(`${name}-vpc-cni`, ..., {parent})` under its Cluster; addons/cni-addon.ts: `new
    aws.eks.Addon(name, ..., {parent: this})`)."""
    eks_cluster = plan.one("eks:index:Cluster")
    component = child_urn(eks_cluster.urn, "eks:index:VpcCniAddon", f"{eks_cluster.name}-vpc-cni")
    return component, child_urn(component, ADDON, f"{eks_cluster.name}-vpc-cni")


def test_the_vpc_cni_alias_names_the_component_pulumi_eks_made(stack_plan):
    """The alias (a spec: the parent it had, the name and type it keeps) gives the URN of pulumi-eks's
    own `VpcCniAddon`; the add-on inside it is the provider's to alias, which it does not do
    (UPGRADING.md). The SDK's other alias is pulumi-eks's own, the type's earlier name."""
    _, plan = stack_plan
    cni = plan.one("eks:index:VpcCniAddon")
    [parent] = [urn for urn in cni.alias_parents if urn]
    assert cni.alias_names == ["", ""]  # the name is kept
    old_component, _ = pulumi_eks_cni_urns(plan)
    assert child_urn(parent, cni.type, cni.name) == old_component


UPGRADING_HEADING = "## A kept bucket stays guarded; add-ons stay put; nodes lock memory (issue 60)"


def upgrading_section() -> str:
    text = (REPO_ROOT / "UPGRADING.md").read_text()
    return text.split(f"\n{UPGRADING_HEADING}\n", 1)[1].split("\n## ", 1)[0]


def state_of(*entries: dict) -> dict:
    return {"version": 3, "deployment": {"manifest": {}, "resources": list(entries)}}


@pytest.mark.skipif(shutil.which("jq") is None, reason="the rewrite runs the jq of UPGRADING.md")
def test_the_state_rewrite_of_upgrading_moves_the_add_on_to_the_urns_the_program_registers(stack_plan):
    """A state with the add-on pulumi-eks made inside its cluster, rewritten by UPGRADING.md's jq
    filter, holds it at the URN the program's `VpcCniAddon` gives it, under that component, with
    every reference moved; a stray new component is dropped; a state without the old URNs is left
    alone."""
    _, plan = stack_plan
    [filter_text] = re.findall(r"\njq '(.*?)' state\.json > moved\.json\n", upgrading_section(), re.DOTALL)
    cluster, eks_cluster = plan.one("eks-ray-train:infra:Cluster"), plan.one("eks:index:Cluster")
    cni = plan.one("eks:index:VpcCniAddon")
    old_component, old_addon = pulumi_eks_cni_urns(plan)
    provider = "urn:pulumi:dev::eks-ray-train::pulumi:providers:aws::default_7_25_0::0a1b"
    addon_id = f"{eks_cluster.inputs['name']}:vpc-cni"

    def rewritten(state: dict) -> dict:
        done = subprocess.run(["jq", filter_text], input=json.dumps(state), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    before = state_of(
        {"urn": cluster.urn, "type": cluster.type, "custom": False},
        {"urn": eks_cluster.urn, "type": eks_cluster.type, "custom": False, "parent": cluster.urn},
        {"urn": old_component, "type": cni.type, "custom": False, "parent": eks_cluster.urn},
        {
            "urn": old_addon,
            "type": ADDON,
            "custom": True,
            "id": addon_id,
            "parent": old_component,
            "provider": provider,
        },
        {"urn": cni.urn, "type": cni.type, "custom": False, "parent": cluster.urn},  # left by a failed `up`
        {"urn": "urn:pulumi:dev::eks-ray-train::test:index:Dependent::d", "dependencies": [old_addon]},
    )
    after = rewritten(before)["deployment"]["resources"]
    new_addon = child_urn(cni.urn, ADDON, cni.name)
    assert [r["urn"] for r in after] == [
        cluster.urn,
        eks_cluster.urn,
        cni.urn,
        new_addon,
        "urn:pulumi:dev::eks-ray-train::test:index:Dependent::d",
    ]
    assert after[2]["parent"] == cluster.urn and after[3]["parent"] == cni.urn
    assert after[3]["id"] == addon_id and after[3]["provider"] == provider
    assert after[4]["dependencies"] == [new_addon]
    # Each parent and dependency precedes its resource, as `pulumi stack import` requires.
    seen = {cluster.urn}
    for resource in after[1:]:
        assert {
            resource.get("parent", cluster.urn),
            *resource.get("dependencies", []),
        } <= seen
        seen.add(resource["urn"])
    current = state_of(before["deployment"]["resources"][0], before["deployment"]["resources"][4])
    assert rewritten(current) == current
