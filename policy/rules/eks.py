"""The EKS cluster: secrets encrypted, the VPC CNI on a role of its own, control-plane logs on,
deletion protection outside dev stacks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    AWS_EKS_CLUSTER,
    EKS_ADDON,
    PULUMI_EKS_CLUSTER,
    PULUMI_EKS_VPC_CNI,
    StackResource,
    dig,
    is_dev_stack,
    is_true,
    is_unknown,
    items,
)
from .registry import ADVISORY, MANDATORY, resource_rule, stack_rule

# The VPC CNI's managed add-on and the service account it runs as (EKS user guide, "Configure Amazon
# VPC CNI plugin to use IRSA").
VPC_CNI_ADDON = "vpc-cni"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"

# The control-plane log types EKS can send to CloudWatch.
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")


@resource_rule(
    "eks-secrets-kms-encrypted",
    MANDATORY,
    description="EKS encrypts Kubernetes secrets with a KMS key.",
    resources="EKS clusters (pulumi-eks and `aws.eks.Cluster`)",
    requires="Kubernetes secrets envelope-encrypted with a KMS key",
)
def eks_secrets_encrypted(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Kubernetes secrets of the cluster are envelope-encrypted with a KMS key."""
    if resource_type == PULUMI_EKS_CLUSTER:
        if props.get("encryptionConfigKeyArn") in (None, ""):
            return [
                "encryptionConfigKeyArn is not set: pass a KMS key ARN so Kubernetes secrets are encrypted"
            ]
    elif resource_type == AWS_EKS_CLUSTER:
        config = props.get("encryptionConfig")
        if is_unknown(config):
            return []
        resources = dig(config, "resources")
        key_arn = dig(config, "provider", "keyArn")
        if (
            config is None
            or key_arn in (None, "")
            or not (is_unknown(resources) or "secrets" in items(resources))
        ):
            return ["encryptionConfig must name a KMS key (provider.keyArn) for resources ['secrets']"]
    return []


@resource_rule(
    "eks-control-plane-logging",
    ADVISORY,
    description="EKS sends every control-plane log type to CloudWatch.",
    resources="EKS clusters",
    requires=f"every control-plane log type ({', '.join(f'`{log}`' for log in CONTROL_PLANE_LOG_TYPES)}) enabled",
)
def control_plane_logging(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Every control-plane log type goes to CloudWatch, so API calls and auth decisions can be audited."""
    if resource_type not in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER):
        return []
    enabled = props.get("enabledClusterLogTypes")
    if is_unknown(enabled):
        return []
    missing = [log for log in CONTROL_PLANE_LOG_TYPES if log not in items(enabled)]
    if missing:
        return [f"control-plane logs off for {', '.join(missing)}: add them to enabledClusterLogTypes"]
    return []


@resource_rule(
    "eks-deletion-protection",
    ADVISORY,
    description="EKS clusters of non-dev stacks have deletion protection on.",
    resources="EKS clusters",
    requires="deletion protection on, except in dev stacks (`dev`, `dev-*`, `*-dev`)",
)
def deletion_protection(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Outside dev stacks the cluster is protected from an accidental `pulumi destroy` or console delete."""
    if resource_type not in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER) or is_dev_stack(stack):
        return []
    protection = props.get("deletionProtection")
    if is_true(protection) or is_unknown(protection):
        return []
    return [f"stack {stack} is not a dev stack: set deletionProtection on the EKS cluster"]


def _names_role(value: Any) -> bool:
    """A role ARN property that names a role; an unknown value counts."""
    return is_unknown(value) or (isinstance(value, str) and bool(value))


def _has_own_role(addon: StackResource) -> bool:
    """The add-on's service account assumes a role of its own: `serviceAccountRoleArn` (IRSA), or an
    EKS Pod Identity association for aws-node; an unknown value counts."""
    if _names_role(addon.props.get("serviceAccountRoleArn")):
        return True
    associations = addon.props.get("podIdentityAssociations")
    return is_unknown(associations) or any(
        dig(association, "serviceAccount") == VPC_CNI_SERVICE_ACCOUNT for association in items(associations)
    )


def is_vpc_cni_addon(resource: StackResource) -> bool:
    """pulumi-eks's VPC CNI component, or a `vpc-cni` managed add-on (an unknown name counts)."""
    name = resource.props.get("addonName")
    return resource.type == PULUMI_EKS_VPC_CNI or (
        resource.type == EKS_ADDON and (name == VPC_CNI_ADDON or is_unknown(name))
    )


@stack_rule(
    "vpc-cni-irsa",
    MANDATORY,
    description="The VPC CNI (aws-node) runs as a role of its own, not the node role.",
    resources="EKS clusters and their vpc-cni add-ons (pulumi-eks `VpcCniAddon`, `aws.eks.Addon`)",
    requires="every vpc-cni add-on sets `serviceAccountRoleArn` (or a Pod Identity association for `aws-node`); every cluster has one: a pulumi-eks cluster through `vpcCniOptions.serviceAccountRoleArn`, or, with `useDefaultVpcCni`, an add-on of its own in the stack",
)
def vpc_cni_irsa(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """aws-node, which creates and attaches network interfaces, runs with those rights in a role of its
    own, so the node role, which every host-network pod reads from instance metadata, need not hold
    them (EKS user guide, "Configure Amazon VPC CNI plugin to use IRSA")."""
    addons = [r for r in resources if is_vpc_cni_addon(r)]
    violations = [
        (
            addon.urn,
            "the vpc-cni add-on sets no serviceAccountRoleArn, so aws-node runs with the node role's rights: "
            "give it an IRSA role trusted for kube-system:aws-node that holds AmazonEKS_CNI_Policy",
        )
        for addon in addons
        if not _has_own_role(addon)
    ]
    for cluster in (r for r in resources if r.type in (PULUMI_EKS_CLUSTER, AWS_EKS_CLUSTER)):
        if cluster.type == PULUMI_EKS_CLUSTER and is_true(dig(cluster.props, "autoMode", "enabled")):
            continue  # EKS Auto Mode runs its own networking, no aws-node
        makes_its_own = cluster.type == PULUMI_EKS_CLUSTER and not is_true(
            cluster.props.get("useDefaultVpcCni")
        )
        if makes_its_own:
            if not _names_role(dig(cluster.props, "vpcCniOptions", "serviceAccountRoleArn")):
                violations.append(
                    (
                        cluster.urn,
                        "the cluster's vpc-cni add-on gets no role (vpcCniOptions.serviceAccountRoleArn), so "
                        "aws-node runs with the node role's rights: set useDefaultVpcCni and add a "
                        "VpcCniAddon whose serviceAccountRoleArn is an IRSA role for kube-system:aws-node",
                    )
                )
            continue
        name = cluster.props.get("name")
        own = [
            addon
            for addon in addons
            if cluster.urn in addon.dependencies
            or is_unknown(addon.props.get("clusterName"))
            or (isinstance(name, str) and addon.props.get("clusterName") == name)
            or is_unknown(name)
        ]
        if not own:
            violations.append(
                (
                    cluster.urn,
                    "the cluster has no vpc-cni add-on in the stack, so aws-node runs as EKS installs it, with "
                    "the node role's rights: add one whose serviceAccountRoleArn is an IRSA role for "
                    "kube-system:aws-node",
                )
            )
    return violations
