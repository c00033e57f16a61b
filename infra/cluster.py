"""The EKS control plane (pulumi-eks) with KMS-encrypted secrets, OIDC, logging and API auth."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra.config import StackSettings

CONTROL_PLANE_LOGS = ["api", "audit", "authenticator", "controllerManager", "scheduler"]


class Cluster(pulumi.ComponentResource):
    """EKS cluster without a default node group; node groups and CoreDNS come separately.

    CoreDNS is installed as a managed add-on here but only after the system node group exists
    (`install_coredns`), because the add-on stays degraded, and its creation can time out, on a
    cluster with no node to run on.
    """

    def __init__(
        self,
        name: str,
        *,
        settings: StackSettings,
        vpc_id: pulumi.Input[str],
        private_subnet_ids: list[pulumi.Input[str]],
        public_subnet_ids: list[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.name = settings.cluster_name

        self.secrets_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"Envelope encryption of Kubernetes secrets in EKS cluster {settings.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=7,
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
            enabled_cluster_log_types=CONTROL_PLANE_LOGS,
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(enabled=True),
            tags={"project": "eks-ray-train"},
            opts=child,
        )
        # The name as an Output of the cluster: whatever uses it depends on the cluster, so
        # `pulumi destroy` removes node groups and add-ons before the control plane.
        self.cluster_name = self.eks.cluster_security_group_id.apply(lambda _: settings.cluster_name)
        self.kubeconfig = pulumi.Output.secret(self.eks.kubeconfig_json)
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
        # Exactly what an EKS node needs: join the cluster, run the VPC CNI, pull images.
        self.node_role_policies = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy.split('/')[-1]}",
                role=self.node_role.name,
                policy_arn=policy,
                opts=child,
            )
            for policy in NODE_POLICIES
        ]
        self.register_outputs({"clusterName": self.name, "securityGroupId": self.security_group_id})

    def install_coredns(self, after: list[pulumi.Resource]) -> aws.eks.Addon:
        """The CoreDNS managed add-on, created once nodes exist to run it."""
        return aws.eks.Addon(
            "coredns",
            cluster_name=self.cluster_name,
            addon_name="coredns",
            resolve_conflicts_on_create="OVERWRITE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )


NODE_POLICIES = [
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
]
