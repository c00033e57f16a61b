"""The EKS control plane (pulumi-eks) with KMS-encrypted secrets, OIDC, logging and API auth; the
node role, and the VPC CNI with a role of its own."""

from __future__ import annotations

import json
from typing import Any, cast

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra.aws_rules.live_stack import (
    KUBE_PROXY_ADDON,
    OWNER_TAG,
    VPC_CNI_ADDON,
    LiveCluster,
    control_plane_log_group,
)
from infra.config.stack import StackSettings
from infra.resources.irsa import irsa_role
from infra.resources.keys import account_statement, customer_key
from platform_contract import PROJECT

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
# The EKS managed policy that makes an access entry a cluster administrator, for the whole cluster.
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
CLUSTER_TAGS = {"project": PROJECT}

# What a node needs and no more (EKS user guide, "Amazon EKS node IAM role"): join the cluster, and
# pull images from ECR (`AmazonEC2ContainerRegistryPullOnly`: the pull actions of
# `AmazonEC2ContainerRegistryReadOnly` without its describe and list ones). The VPC CNI's rights
# (`AmazonEKS_CNI_Policy`: create, attach and modify any network interface in the region) are its
# own role's, not the node's: every host-network pod reads the node role's credentials from IMDS.
NODE_POLICIES = [
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
]
# The VPC CNI's service account and policy (EKS user guide, "Configure Amazon VPC CNI plugin to use
# IRSA": the plugin runs as `aws-node` in kube-system; an IPv4 cluster's rights are the managed policy).
VPC_CNI_NAMESPACE = "kube-system"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"
VPC_CNI_POLICY = "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"
# The managed add-ons pulumi-eks makes (`Cluster._vpc_cni` for vpc-cni). Given no version, pulumi-eks
# asks EKS for the newest build on every run (`aws.eks.getAddonVersion`, mostRecent;
# nodejs/eks/cluster/cluster.ts, addons/cni-addon.ts) and applies it with OVERWRITE, so an unrelated
# `pulumi up` would restart aws-node and kube-proxy on every node, GPU nodes in a run among them: the
# program gives both a version, kept as CoreDNS's is.
PULUMI_EKS_ADDONS = (VPC_CNI_ADDON, KUBE_PROXY_ADDON)


def owner() -> str:
    """The value of `OWNER_TAG` for this stack."""
    return f"{pulumi.get_project()}/{pulumi.get_stack()}"


def cluster_key_policy(account_id: str, region: str, log_group_name: str) -> str:
    """The cluster key's policy: the account manages it (the default key policy), and CloudWatch Logs
    may use it for the control-plane log group, and no other ("Encrypt log data in CloudWatch Logs
    using AWS KMS": the service principal of the region, bound by the log group's encryption context)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                account_statement(account_id),
                {
                    "Sid": "ControlPlaneLogGroup",
                    "Effect": "Allow",
                    "Principal": {"Service": f"logs.{region}.amazonaws.com"},
                    "Action": [
                        "kms:Encrypt*",
                        "kms:Decrypt*",
                        "kms:ReEncrypt*",
                        "kms:GenerateDataKey*",
                        "kms:Describe*",
                    ],
                    "Resource": "*",
                    "Condition": {
                        "ArnLike": {
                            "kms:EncryptionContext:aws:logs:arn": (
                                f"arn:aws:logs:{region}:{account_id}:log-group:{log_group_name}"
                            )
                        }
                    },
                },
            ],
        }
    )


def access_entry_name(principal_arn: str) -> str:
    """A resource name for a principal's access entry: its account, kind and name, stable across runs."""
    account, resource = principal_arn.split(":")[4], principal_arn.split(":", 5)[5]
    kind, _, path_and_name = resource.partition("/")
    return f"admin-{account}-{kind}-{path_and_name.replace('/', '-')}"


def names_same_principal(caller_arn: str, principal_arn: str) -> bool:
    """Whether the caller (an IAM user, or an STS session of a role) is the IAM principal `principal_arn`.

    A session ARN (`arn:aws:sts::<account>:assumed-role/<role>/<session>`) carries the role's name
    but not its path, so a role is matched by account and name.
    """
    if caller_arn == principal_arn:
        return True
    caller, principal = caller_arn.split(":", 5), principal_arn.split(":", 5)
    if caller[2] != "sts" or not caller[5].startswith("assumed-role/"):
        return False
    return (
        caller[4] == principal[4]
        and principal[5].startswith("role/")
        and caller[5].split("/")[1] == principal[5].rsplit("/", 1)[-1]
    )


class Cluster(pulumi.ComponentResource):
    """EKS cluster without a default node group; node groups and CoreDNS come separately.

    CoreDNS is installed as a managed add-on here but only after the system node group exists
    (`install_coredns`), because the add-on stays degraded, and its creation can time out, on a
    cluster with no node to run on. kube-proxy and vpc-cni come with the cluster, at the versions
    `addon_version` keeps (`live`: the cluster as the preview read it, None before it exists).
    """

    def __init__(
        self,
        name: str,
        *,
        settings: StackSettings,
        vpc_id: pulumi.Input[str],
        private_subnet_ids: list[pulumi.Input[str]],
        public_subnet_ids: list[pulumi.Input[str]],
        live: LiveCluster | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.name = settings.cluster_name
        identity = settings.aws_identity
        # Each a plain string known at preview, so no add-on's version is left to pulumi-eks's lookup.
        self.addon_versions = {
            addon: addon_version(addon, settings.kubernetes_version, live) for addon in PULUMI_EKS_ADDONS
        }

        log_group_name = control_plane_log_group(settings.cluster_name)
        # One key for Kubernetes secrets and the control-plane logs; its policy names the log group.
        self.secrets_key = customer_key(
            f"{name}-secrets",
            description=f"Envelope encryption of Kubernetes secrets and control-plane logs of EKS cluster {settings.cluster_name}",
            policy=cluster_key_policy(aws.get_caller_identity().account_id, settings.region, log_group_name),
            opts=child,
        )
        # Created before the cluster, with a retention: EKS would otherwise create it, keeping logs
        # forever. After the key: CloudWatch checks the key policy when the key is associated.
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane",
            name=log_group_name,
            retention_in_days=settings.log_retention_days,
            kms_key_id=self.secrets_key.arn,
            # Tells this stack's group from one a destroyed cluster left behind (`infra.preflight.reads.live_stack`).
            tags={OWNER_TAG: owner()},
            opts=child,
        )
        self.eks = eks.Cluster(
            name,
            name=settings.cluster_name,
            version=settings.kubernetes_version,
            vpc_id=vpc_id,
            private_subnet_ids=private_subnet_ids,
            public_subnet_ids=public_subnet_ids,
            node_associate_public_ip_address=False,
            skip_default_node_group=True,
            skip_default_security_groups=True,
            authentication_mode=eks.AuthenticationMode.API,
            endpoint_private_access=True,
            endpoint_public_access=settings.endpoint_public_access,
            public_access_cidrs=list(settings.endpoint_public_access_cidrs) or None,
            encryption_config_key_arn=self.secrets_key.arn,
            create_oidc_provider=True,
            # Through the log group, so the control plane inside pulumi-eks waits for it too.
            enabled_cluster_log_types=self.log_group.name.apply(lambda _: CONTROL_PLANE_LOGS),
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(
                enabled=True, version=self.addon_versions[KUBE_PROXY_ADDON]
            ),
            # The vpc-cni add-on comes after the cluster (`self.vpc_cni`): its role trusts the
            # cluster's OIDC provider, which the cluster makes.
            use_default_vpc_cni=True,
            provider_credential_opts=eks.KubeconfigOptionsArgs(
                profile_name=identity.profile, role_arn=identity.role_arn
            )
            if identity.profile or identity.role_arn
            else None,
            tags=CLUSTER_TAGS,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.log_group]),
        )
        # The name as an Output of the cluster: whatever uses it depends on the cluster, so
        # `pulumi destroy` removes node groups and add-ons before the control plane.
        self.cluster_name = self.eks.cluster_security_group_id.apply(lambda _: settings.cluster_name)
        # The control plane's version once it is applied: node groups and add-ons that take it update
        # after the control plane, which EKS requires of an upgrade (nodes never newer than it).
        self.kubernetes_version = self.eks.eks_cluster.version
        # For people: no profile in it, so each user's own AWS credentials apply.
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(self.eks.kubeconfig_json)
        # For this program's Kubernetes provider: the identity Pulumi itself runs as.
        self.provider_kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            self.eks.get_kubeconfig(profile_name=identity.profile, role_arn=identity.role_arn)
        )
        self.security_group_id = self.eks.cluster_security_group_id
        self.oidc_provider_arn = self.eks.oidc_provider_arn
        self.oidc_provider_url = self.eks.oidc_provider_url

        self.node_role = aws.iam.Role(
            f"{name}-node",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            opts=child,
        )
        # Exactly what an EKS node needs: join the cluster, pull images.
        self.node_role_policies = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy.split('/')[-1]}",
                role=self.node_role.name,
                policy_arn=policy,
                opts=child,
            )
            for policy in NODE_POLICIES
        ]
        self.vpc_cni = self._vpc_cni(name)
        # What nodes wait for: their role's policies, and the CNI running as its own role, so that
        # aws-node on a new node never starts without the rights it needs.
        self.node_prerequisites: list[pulumi.Resource] = [*self.node_role_policies, self.vpc_cni]
        # Admins besides the cluster's creator, who gets an access entry from EKS at creation.
        caller = aws.get_caller_identity().arn if settings.admin_principal_arns else ""
        for principal in settings.admin_principal_arns:
            if names_same_principal(caller, principal):
                pulumi.log.warn(
                    f"config key 'adminPrincipalArns' lists {principal}, the identity running Pulumi: if it "
                    "creates the cluster, EKS already gives it an access entry and this one fails "
                    "(ResourceInUseException); leave the cluster's creator out of adminPrincipalArns"
                )
        self.admin_access = [self._admin(principal) for principal in settings.admin_principal_arns]
        self.register_outputs({"clusterName": self.name, "securityGroupId": self.security_group_id})

    def _vpc_cni(self, name: str) -> eks.VpcCniAddon:
        """The vpc-cni managed add-on, its service account `aws-node` assuming a role of its own (IRSA)
        that holds `AmazonEKS_CNI_Policy`, and its network policy agent on (without it NetworkPolicy
        objects are not enforced; pulumi-eks sets the add-on's `enableNetworkPolicy: "true"`).

        pulumi-eks's `VpcCniAddon`, made here after the cluster rather than by the cluster
        (`useDefaultVpcCni`): a role in the cluster's own `vpcCniOptions.serviceAccountRoleArn` would
        trust the cluster's OIDC provider, an output of that same cluster. It takes the cluster's
        name and version as pulumi-eks gave them, and the add-on's version as `addon_version` keeps
        it. The alias names the `VpcCniAddon` pulumi-eks made under its cluster for stacks deployed
        before 2026-12-05; it does not reach the `aws.eks.Addon` inside it, which pulumi-eks's
        provider registers without aliases (UPGRADING.md, issue 60, says what such a stack does).
        """
        child = pulumi.ResourceOptions(parent=self)
        role = irsa_role(
            f"{name}-vpc-cni",
            oidc_provider_arn=self.oidc_provider_arn,
            oidc_provider_url=self.oidc_provider_url,
            namespace=VPC_CNI_NAMESPACE,
            service_account=VPC_CNI_SERVICE_ACCOUNT,
            opts=child,
        )
        policy = aws.iam.RolePolicyAttachment(
            f"{name}-vpc-cni", role=role.name, policy_arn=VPC_CNI_POLICY, opts=child
        )
        return eks.VpcCniAddon(
            f"{name}-vpc-cni",
            cluster_name=self.cluster_name,
            cluster_version=self.kubernetes_version,
            addon_version=self.addon_versions[VPC_CNI_ADDON],
            enable_network_policy=True,
            service_account_role_arn=role.arn,
            # The schema types `tags` as a list of maps; the add-on passes it to `aws.eks.Addon` as
            # the map it is (pulumi-eks nodejs/eks/addons/cni-addon.ts), as the cluster did.
            tags=cast(Any, CLUSTER_TAGS),
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[policy], aliases=[pulumi.Alias(parent=self.eks)]
            ),
        )

    def _admin(self, principal_arn: str) -> aws.eks.AccessPolicyAssociation:
        """An access entry for the principal with the cluster-admin access policy, cluster-wide."""
        name = access_entry_name(principal_arn)
        entry = aws.eks.AccessEntry(
            name,
            cluster_name=self.cluster_name,
            principal_arn=principal_arn,
            type="STANDARD",
            opts=pulumi.ResourceOptions(parent=self),
        )
        return aws.eks.AccessPolicyAssociation(
            name,
            cluster_name=self.cluster_name,
            principal_arn=entry.principal_arn,
            policy_arn=CLUSTER_ADMIN_POLICY,
            access_scope={"type": "cluster"},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def install_coredns(self, version: str, after: list[pulumi.Resource]) -> aws.eks.Addon:
        """The CoreDNS managed add-on at `version`, created once nodes exist to run it.

        Pinned, and moved only with `kubernetesVersion`: EKS does not upgrade an add-on with the
        control plane, and supports each CoreDNS version on a range of Kubernetes versions only
        (`eks:DescribeAddonVersions`). `addon_version` gives the newest build for the cluster's
        version when the cluster is created or its version changes, and otherwise the version the
        live add-on runs, so a build EKS publishes later does not reach the cluster through an
        unrelated `pulumi up`, which would roll CoreDNS and, with OVERWRITE, set values changed on
        its Kubernetes objects back to EKS's defaults (`eks:UpdateAddon`, resolveConflicts).
        `addon_version` keeps the CloudWatch Observability add-on's version the same way.
        """
        return aws.eks.Addon(
            "coredns",
            cluster_name=self.cluster_name,
            addon_name="coredns",
            addon_version=version,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )


def addon_version(addon_name: str, kubernetes_version: str, live: LiveCluster | None) -> str:
    """The version of the managed add-on `addon_name` for a cluster of `kubernetes_version`, `live`
    as the preview read it (CoreDNS, kube-proxy, vpc-cni, and the CloudWatch Observability add-on of
    `observability`)."""
    return kept_addon_version(
        live_version=live.addon_versions.get(addon_name) if live else None,
        live_kubernetes_version=live.version if live else None,
        kubernetes_version=kubernetes_version,
        newest=newest_addon_version(addon_name, kubernetes_version),
    )


def kept_addon_version(
    live_version: str | None, live_kubernetes_version: str | None, kubernetes_version: str, newest: str
) -> str:
    """The live add-on's version while the cluster stays at `kubernetes_version`; else `newest`, the
    newest EKS offers for it: on a first deploy, without the add-on, and when the version moves."""
    if live_version and live_kubernetes_version == kubernetes_version:
        return live_version
    return newest


def newest_addon_version(addon_name: str, kubernetes_version: str) -> str:
    """The newest version of `addon_name` EKS offers for `kubernetes_version` (asked at preview)."""
    return aws.eks.get_addon_version(
        addon_name=addon_name, kubernetes_version=kubernetes_version, most_recent=True
    ).version
