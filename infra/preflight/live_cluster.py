"""The cluster this stack already runs, read in the preview and checked against the settings it
cannot change (VPC block, Kubernetes version); a DEGRADED GPU group is warned about with its fix
(`infra.aws_rules.live_stack.gpu_group_warning`). A read that fails with anything but NotFound stops
the preview (`infra.preflight.reads.live_stack.UnreadLiveStack`): without it the stack would be planned as
new. With the public endpoint off, this machine must reach the private one: its name is resolved and
each address in the VPC tried on the endpoint's port."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pulumi

from infra.aws_rules.live_stack import (
    LiveCluster,
    addresses_in_vpc,
    control_plane_log_group,
    gpu_group_warning,
    private_endpoint_problem,
    unread_cause,
    version_change_problem,
    vpc_change_problem,
)
from infra.config.stack import ConfigError, StackSettings
from infra.preflight.errors import PreflightError
from infra.preflight.reads.live_stack import UnreadLiveStack, orphaned_log_group, read_live_cluster

# How long the preview waits for each address of the private endpoint to accept a connection.
ENDPOINT_CONNECT_TIMEOUT_S = 5.0


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to on this machine; none when it does not resolve."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def accepts(address: str, port: int) -> bool:
    """Whether `address` accepts a TCP connection on `port` from this machine."""
    try:
        with socket.create_connection((address, port), timeout=ENDPOINT_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _private_endpoint_refusal(live: LiveCluster | None) -> str | None:
    """Why `endpointPublicAccess: false` would leave this machine without the Kubernetes API."""
    host, port, addresses, accepted = "", 443, [], []
    if live is not None:
        url = urlsplit(live.endpoint)
        host, port = url.hostname or live.endpoint, url.port or 443
        addresses = resolve(host, port)
        accepted = [address for address in addresses_in_vpc(addresses, live) if accepts(address, port)]
    problem = private_endpoint_problem(live, host, addresses, accepted)
    if problem is None:
        return None
    return (
        f"config key 'endpointPublicAccess' = false: {problem}. `pulumi up` and the training run call the "
        "Kubernetes API from this machine, which a private endpoint admits only from inside the VPC or a "
        "network connected to it"
    )


def checked_live_cluster(settings: StackSettings) -> LiveCluster | None:
    """The cluster this stack already runs, checked against the settings that it cannot change, and,
    with the public endpoint off, against this machine's way to the private one."""
    try:
        live = read_live_cluster(settings.cluster_name)
    except UnreadLiveStack as unread:
        raise PreflightError(_unread_refusal(settings, unread)) from None
    if not settings.endpoint_public_access:
        refusal = _private_endpoint_refusal(live)
        if refusal:
            raise ConfigError(refusal)
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


def _unread_refusal(settings: StackSettings, unread: UnreadLiveStack) -> str:
    """One line: what could not be read, why, what the preview would otherwise plan, and the fix."""
    cause = unread_cause(unread.error)
    if cause == "throttled":
        fix = f"AWS throttled the account's {unread.action} calls: run the preview again in a minute"
    elif cause == "denied":
        fix = f"allow {unread.action} to the identity running Pulumi (aws:profile, aws:assumeRole), then run the preview again"
    else:
        fix = "run the preview again once the read works"
    return (
        f"config key 'clusterName' = {settings.cluster_name!r}: could not read {unread.what} in {settings.region} "
        f"({unread.action}: {unread.error}), so the preview cannot tell whether this stack's cluster runs, and "
        "would plan its zones, subnets and GPU node group anew, moving a live cluster's; nothing is planned until "
        f"the read works: {fix}"
    )


def warn_about_a_degraded_gpu_group(settings: StackSettings, live: LiveCluster | None) -> None:
    if live is not None and live.gpu_group is not None:
        warning = gpu_group_warning(
            settings.cluster_name, settings.region, live.gpu_group, settings.gpu_node_count
        )
        if warning:
            pulumi.log.warn(warning)
