"""The cluster this stack already runs, read in the preview and checked against the settings it
cannot change (VPC block, Kubernetes version); a DEGRADED GPU group is warned about with its fix
(`infra.aws_facts.live_stack.gpu_group_warning`)."""

from __future__ import annotations

import pulumi

from infra.aws_facts.live_stack import (
    LiveCluster,
    gpu_group_warning,
    orphaned_log_group,
    read_live_cluster,
    version_change_problem,
    vpc_change_problem,
)
from infra.config.stack import ConfigError, StackSettings
from infra.preflight.errors import PreflightError
from infra.resources.cluster import control_plane_log_group


def checked_live_cluster(settings: StackSettings) -> LiveCluster | None:
    """The cluster this stack already runs, checked against the settings that it cannot change."""
    live = read_live_cluster(settings.cluster_name)
    if live is None:
        log_group = control_plane_log_group(settings.cluster_name)
        if orphaned_log_group(log_group):
            raise PreflightError(
                f"config key 'clusterName' = {settings.cluster_name!r}: no cluster of that name runs, and its log "
                f"group {log_group} is left from one that was destroyed (EKS writes its last logs after the group "
                f"is deleted): delete it with `aws logs delete-log-group --log-group-name {log_group} --region "
                f"{settings.region}`, then run `pulumi up` again"
            )
        return None
    problem = vpc_change_problem(live, settings.vpc_cidr)
    if problem:
        raise ConfigError(f"config key 'vpcCidr' = {settings.vpc_cidr!r}: {problem}")
    problem = version_change_problem(live.version, settings.kubernetes_version)
    if problem:
        raise ConfigError(f"config key 'kubernetesVersion' = {settings.kubernetes_version!r}: {problem}")
    return live


def warn_about_a_degraded_gpu_group(settings: StackSettings, live: LiveCluster | None) -> None:
    if live is not None and live.gpu_group is not None:
        warning = gpu_group_warning(
            settings.cluster_name, settings.region, live.gpu_group, settings.gpu_node_count
        )
        if warning:
            pulumi.log.warn(warning)
