"""The EKS cluster: secrets encrypted, control-plane logs on, deletion protection outside dev stacks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .properties import (
    AWS_EKS_CLUSTER,
    PULUMI_EKS_CLUSTER,
    dig,
    is_dev_stack,
    is_true,
    is_unknown,
    items,
)
from .registry import ADVISORY, MANDATORY, resource_rule

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
