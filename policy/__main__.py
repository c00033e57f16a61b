"""Entry point of the eks-ray-train policy pack: `pulumi preview --policy-pack policy`.

Pulumi runs this directory as a script, so `rules` (the file beside this one) imports as a
top-level module. The rules themselves live there as plain functions; this file only lists them.
"""

from pulumi_policy import PolicyPack
from rules import (
    BUCKETS_TLS_ONLY,
    BUCKETS_VERSIONED,
    CONTAINER_IMAGES_PINNED,
    CONTROL_PLANE_LOGGING,
    DEFAULT_SECURITY_GROUP_CLOSED,
    DELETION_PROTECTION,
    EKS_API_NOT_OPEN,
    EKS_SECRETS_ENCRYPTED,
    GPU_NODE_GROUP_EFA,
    GPU_NODE_GROUP_SINGLE_SUBNET,
    IMDSV2_REQUIRED,
    LOG_GROUPS_KMS_ENCRYPTED,
    LOG_RETENTION,
    METADATA_HOP_LIMIT,
    NAMESPACE_POD_SECURITY,
    NODES_WITHOUT_PUBLIC_IPS,
    RAY_HEAD_NETWORK_POLICY,
    RAY_PORTS_NOT_EXPOSED,
    RAY_WORKERS_GUARANTEED,
)

PolicyPack(
    name="eks-ray-train",
    description="Security and EFA placement guarantees of the eks-ray-train stacks.",
    policies=[
        rule.to_policy()
        for rule in (
            NODES_WITHOUT_PUBLIC_IPS,
            IMDSV2_REQUIRED,
            METADATA_HOP_LIMIT,
            NAMESPACE_POD_SECURITY,
            EKS_SECRETS_ENCRYPTED,
            EKS_API_NOT_OPEN,
            GPU_NODE_GROUP_SINGLE_SUBNET,
            GPU_NODE_GROUP_EFA,
            RAY_HEAD_NETWORK_POLICY,
            RAY_PORTS_NOT_EXPOSED,
            RAY_WORKERS_GUARANTEED,
            CONTAINER_IMAGES_PINNED,
            BUCKETS_TLS_ONLY,
            BUCKETS_VERSIONED,
            LOG_GROUPS_KMS_ENCRYPTED,
            LOG_RETENTION,
            CONTROL_PLANE_LOGGING,
            DEFAULT_SECURITY_GROUP_CLOSED,
            DELETION_PROTECTION,
        )
    ],
)
