"""The EKS node monitoring agent add-on, whose node conditions the GPU group's node auto repair acts on."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.aws_rules.node_repair import ADDON_NAME, addon_configuration


def node_monitoring_agent(
    *, cluster_name: pulumi.Input[str], version: str, after: list[pulumi.Resource], parent: pulumi.Resource
) -> aws.eks.Addon:
    """The `eks-node-monitoring-agent` managed add-on at `version`, kept as CoreDNS's is
    (`infra.resources.cluster.addon_version`: the live add-on's version until `kubernetesVersion`
    moves, else the newest EKS offers for it). It needs no IAM role of its own (EKS user guide,
    "Detect node health issues with the EKS node monitoring agent"). `after`: the node groups, on
    which its DaemonSets must run before EKS calls it active; `cluster_name` as an Output of the
    cluster, so that it goes before the control plane on `pulumi destroy`."""
    return aws.eks.Addon(
        ADDON_NAME,
        cluster_name=cluster_name,
        addon_name=ADDON_NAME,
        addon_version=version,
        configuration_values=json.dumps(addon_configuration()),
        resolve_conflicts_on_create="OVERWRITE",
        resolve_conflicts_on_update="OVERWRITE",
        opts=pulumi.ResourceOptions(parent=parent, depends_on=after),
    )
