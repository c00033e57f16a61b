"""The cluster's Kubernetes version against the versions EKS offers in the region (DescribeClusterVersions)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.config.cross_keys import version_key
from infra.config.stack import ConfigError


def kubernetes_version_problem(version: str, offered: dict[str, str]) -> str | None:
    """Why EKS will not create a cluster of `version`, from DescribeClusterVersions' answer
    (version -> `versionStatus`: STANDARD_SUPPORT, EXTENDED_SUPPORT or UNSUPPORTED)."""
    usable = sorted((v for v, status in offered.items() if status != "UNSUPPORTED"), key=version_key)
    if offered.get(version, "UNSUPPORTED") == "UNSUPPORTED":
        return f"EKS offers {', '.join(usable)} here: pick one of them"
    return None


def check_kubernetes_version(version: str, region: str) -> str | None:
    """EKS creates clusters only of the versions DescribeClusterVersions lists; one in extended
    support costs more per cluster-hour (EKS pricing), which the preview says. Returns the
    version's status, None where it could not be read."""
    try:
        answer = aws.eks.get_cluster_versions()
    except Exception as err:  # e.g. no eks:DescribeClusterVersions permission: EKS judges at create
        pulumi.log.warn(
            f"kubernetesVersion {version} was not checked against EKS's versions in {region} ({err})"
        )
        return None
    offered = {item.cluster_version: item.version_status for item in answer.cluster_versions}
    problem = kubernetes_version_problem(version, offered)
    if problem:
        raise ConfigError(f"config key 'kubernetesVersion' = {version!r}: {problem}")
    if offered[version] == "EXTENDED_SUPPORT":
        pulumi.log.warn(
            f"kubernetesVersion {version} is in EKS extended support in {region}, billed at a higher rate per "
            "cluster-hour than standard support: schedule an upgrade"
        )
    return offered[version]
