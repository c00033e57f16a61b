"""The Ray pods' NetworkPolicies: every Ray pod isolated for ingress by rules that name their peers,
and every namespace of Ray pods denying all traffic by default.

Every Ray pod serves jobs: the head's GCS, dashboard and client ports, and on every pod the dashboard
agent's `POST /api/job_agent/jobs/` (KubeRay v1.7.0 starts each with --dashboard-agent-listen-port
52365), behind Ray's token alone. NetworkPolicies are read as Kubernetes reads them ("Network
Policies" in its documentation, and the API reference of NetworkPolicySpec and NetworkPolicyPeer):
a pod is isolated for a direction by any policy of its namespace selecting it with that policy type
(defaulted: Ingress always, Egress with egress rules); policies add up, so one rule that admits
everyone opens the pod. A peer names its peers unless it is a namespace selector that names no
namespace (`{}`: every namespace; `Exists`, `NotIn`, `DoesNotExist` alone: every namespace without
or with a label), or an ipBlock of every address (`/0`) or holding addresses of a VPC of the stack
(its nodes', and with the VPC CNI its pods'). A pod selector alone names pods of the policy's own
namespace. A `ports` entry with `endPort` is a range; one of 1024 ports or more, or reaching 65535,
is as good as every port.

KubeRay (v1.7.0, ray-operator/controllers/ray/common/pod.go, `DefaultHeadPodTemplate`,
`DefaultWorkerPodTemplate`, `labelPod`) labels each Ray pod with its template's labels and its
group's `labels`, over its own `ray.io/is-ray-node: yes`, `ray.io/identifier`,
`app.kubernetes.io/name: kuberay` and `app.kubernetes.io/created-by: kuberay-operator`; and with
`ray.io/cluster` (the RayCluster's name), `ray.io/node-type` and `ray.io/group`, which neither can
override. A RayJob or RayService makes a RayCluster named `<its name>-<5 random characters>`
(utils/util.go, `GenerateRayClusterName`) and labels that RayCluster, not its pods, with
`ray.io/originated-from-cr-name` and `ray.io/originated-from-crd` (rayjob_controller.go,
`constructRayClusterForRayJob`; rayservice_controller.go, `constructRayClusterForRayService`): so
its pods' `ray.io/cluster` is a value no policy can name beforehand, and no label of theirs names
the RayJob or RayService but those its templates give them.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    NETWORK_POLICY,
    VPC,
    StackResource,
    dig,
    is_unknown,
    items,
    type_kind,
)
from .ray import RAY_CLUSTER_LABEL, RAY_NODE_TYPE_LABEL, ray_cluster_spec
from .registry import MANDATORY, stack_rule

RAY_GROUP_LABEL = "ray.io/group"
HEAD_GROUP = "headgroup"  # KubeRay's utils.RayNodeHeadGroupLabelValue
# KubeRay's labels on every Ray pod that a template's labels may override (utils/constant.go).
KUBERAY_POD_LABELS = {
    "ray.io/is-ray-node": "yes",
    "app.kubernetes.io/name": "kuberay",
    "app.kubernetes.io/created-by": "kuberay-operator",
}
RAY_ID_LABEL = "ray.io/identifier"
LABEL_VALUE_LIMIT = 63
# The `ray.io/cluster` of a RayJob's or RayService's pods: their RayCluster's name, which ends in
# characters KubeRay draws at random. No label value holds a NUL, so no selector names this one.
GENERATED_NAME = "\x00<name>-<5 random characters>"
# A `ports` entry of this many ports or more, or one reaching the highest port, admits as good as every port.
WIDE_PORT_RANGE = 1024
HIGHEST_PORT = 65535


class _Unknown(Exception):
    """A value the rule needs is unknown during preview: the rule leaves that case to the next run."""


def _known(value: Any) -> Any:
    if is_unknown(value):
        raise _Unknown
    return value


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a label selector matches `labels`: every `matchLabels` pair and every expression (In,
    NotIn, Exists, DoesNotExist); a missing or empty selector matches all. Raises _Unknown."""
    selector = _known(selector) or {}
    for key, value in (_known(dig(selector, "matchLabels")) or {}).items():
        if _known(value) != labels.get(key):
            return False
    for expression in items(_known(dig(selector, "matchExpressions"))):
        key, operator = _known(dig(expression, "key")), _known(dig(expression, "operator"))
        values = [_known(value) for value in items(_known(dig(expression, "values")))]
        present = key in labels
        holds = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(operator, False)
        if not holds:
            return False
    return True


def _names_namespaces(selector: Any) -> bool:
    selector = _known(selector) or {}
    expressions = items(_known(dig(selector, "matchExpressions")))
    # `In` names namespaces; NotIn, Exists and DoesNotExist alone match every namespace lacking a value.
    return bool(_known(dig(selector, "matchLabels"))) or any(
        _known(dig(expression, "operator")) == "In" for expression in expressions
    )


def _vpc_blocks(resources: Sequence[StackResource]) -> list[Any]:
    return [r.props.get("cidrBlock") for r in resources if r.type == VPC]


def open_peer(peer: Any, vpc_blocks: Sequence[Any]) -> str | None:
    """Why a `from`/`to` peer admits more than the peers it names; None when it names them."""
    peer = _known(peer)
    if not isinstance(peer, Mapping) or not peer:
        return "an empty peer"
    if "ipBlock" in peer:
        cidr = _known(dig(peer, "ipBlock", "cidr"))
        try:
            block = ipaddress.ip_network(cidr, strict=False)
        except (TypeError, ValueError):
            return f"ipBlock {cidr!r}, which the pack cannot read as a CIDR block"
        if block.prefixlen == 0:
            return f"ipBlock {cidr} (every address)"
        for vpc in (_known(value) for value in vpc_blocks):
            network = ipaddress.ip_network(vpc, strict=False) if isinstance(vpc, str) else None
            if network and network.version == block.version and network.overlaps(block):
                return f"ipBlock {cidr}, which holds addresses of the VPC {vpc} (its nodes' and, with the VPC CNI, its pods')"
        return None
    if "namespaceSelector" in peer and not _names_namespaces(peer["namespaceSelector"]):
        return f"namespaceSelector {_shown(peer['namespaceSelector'])} (every namespace)"
    return None


def _open_rule(rule: Any, peers_key: str, vpc_blocks: Sequence[Any]) -> str | None:
    """Why a rule's peers (`from` or `to`) admit more than named peers; None when they name them."""
    peers = items(_known(dig(rule, peers_key)))
    if not peers:
        return f"no `{peers_key}` (everyone)"
    return next(filter(None, (open_peer(peer, vpc_blocks) for peer in peers)), None)


def policy_types(spec: Any) -> set[str]:
    """`policyTypes`, or Kubernetes' default: Ingress, and Egress when the policy has egress rules."""
    types = [_known(value) for value in items(_known(dig(spec, "policyTypes")))]
    if types:
        return set(types)
    return {"Ingress"} | ({"Egress"} if items(_known(dig(spec, "egress"))) else set())


def _policies_in(resources: Sequence[StackResource], namespace: Any) -> list[StackResource]:
    return [
        r
        for r in resources
        if r.type == NETWORK_POLICY and _known(dig(r.props, "metadata", "namespace")) == namespace
    ]


def _policy_name(policy: StackResource) -> str:
    name = dig(policy.props, "metadata", "name")
    return name if isinstance(name, str) and not is_unknown(name) else policy.urn


def _identifier(cluster_name: str, node_type: str) -> str:
    """KubeRay's `ray.io/identifier`: `<cluster>-<node type>`, cut to a label value from the left,
    a leading punctuation mark made `r` (utils/util.go, `GenerateIdentifier`, `CheckLabel`)."""
    if cluster_name == GENERATED_NAME:
        return GENERATED_NAME
    value = f"{cluster_name}-{node_type}"[-LABEL_VALUE_LIMIT:]
    return f"r{value[1:]}" if value[:1] in "-._" else value


def _pod_kinds(cluster_name: str, spec: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """(what, labels) of each kind of pod KubeRay makes for a RayCluster spec: the head, each worker group."""
    kinds = [("the head", "head", HEAD_GROUP, dig(spec, "headGroupSpec"))]
    for group in items(_known(spec.get("workerGroupSpecs"))):
        name = _known(dig(group, "groupName"))
        kinds.append((f"worker group {name}", "worker", name, group))
    found = []
    for what, node_type, group_name, group_spec in kinds:
        given = {
            key: _known(value)
            for labels in (dig(group_spec, "template", "metadata", "labels"), dig(group_spec, "labels"))
            for key, value in (_known(labels) or {}).items()
        }
        labels = {
            **KUBERAY_POD_LABELS,
            RAY_ID_LABEL: _identifier(cluster_name, node_type),
            **given,
            RAY_CLUSTER_LABEL: cluster_name,
            RAY_NODE_TYPE_LABEL: node_type,
            RAY_GROUP_LABEL: group_name,
        }
        found.append((what, labels))
    return found


def _ingress_problems(
    cluster_name: str, spec: Mapping[str, Any], policies: Sequence[StackResource], vpc_blocks: Sequence[Any]
) -> list[str]:
    problems = []
    opened: dict[tuple[str, int, str], list[str]] = {}  # (policy, rule, why) -> the pods it opens
    for what, labels in _pod_kinds(cluster_name, spec):
        isolating = [
            p
            for p in policies
            if selects(dig(p.props, "spec", "podSelector"), labels)
            and "Ingress" in policy_types(dig(p.props, "spec"))
        ]
        if not isolating:
            problems.append(f"no NetworkPolicy isolates {what} for ingress")
        for policy in isolating:
            for index, rule in enumerate(items(_known(dig(policy.props, "spec", "ingress")))):
                why = _open_rule(rule, "from", vpc_blocks)
                if why:
                    opened.setdefault((_policy_name(policy), index, why), []).append(what)
    problems += [
        f"NetworkPolicy {name} admits {' and '.join(whats)} from {why} (ingress rule {index})"
        for (name, index, why), whats in opened.items()
    ]
    return problems


def _ray_owners(resources: Sequence[StackResource]) -> list[tuple[StackResource, str, Mapping[str, Any]]]:
    """Each RayCluster, RayJob and RayService with its kind and the RayCluster spec its pods come from."""
    found = []
    for resource in resources:
        spec = ray_cluster_spec(resource.type, resource.props)
        if spec is not None:
            found.append((resource, type_kind(resource.type)[1], spec))
    return found


@stack_rule(
    "ray-pods-network-policy",
    MANDATORY,
    description="Every pod of every RayCluster, RayJob and RayService, head and workers, is isolated for ingress by NetworkPolicies naming their peers.",
    resources="RayClusters, RayJobs (`rayClusterSpec`), RayServices (`rayClusterConfig`), NetworkPolicies and VPCs",
    requires="NetworkPolicies in the Ray resource's namespace select its head and every worker group (by the labels KubeRay gives the pods: the template's and the group's `labels`, `ray.io/cluster`, `ray.io/node-type`, `ray.io/group`, `ray.io/is-ray-node`, `ray.io/identifier`, `app.kubernetes.io/name` and `app.kubernetes.io/created-by`; a RayJob's or RayService's pods carry a `ray.io/cluster` with a random suffix, which no selector can count on) for ingress, and every ingress rule of them names its peers: no rule without `from`, no namespace selector that names no namespace (`{}`), no ipBlock of every address or holding a VPC's addresses",
)
def ray_pods_network_policy(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Each Ray resource's pods, every one of which serves jobs (the head's GCS, dashboard and client,
    every pod's dashboard agent), admit only the peers their policies name."""
    vpc_blocks = _vpc_blocks(resources)
    violations = []
    for ray, kind, spec in _ray_owners(resources):
        name, namespace = (dig(ray.props, "metadata", key) for key in ("name", "namespace"))
        try:
            if kind == "RayCluster" and not isinstance(_known(name), str):
                continue
            cluster_name = name if kind == "RayCluster" else GENERATED_NAME
            problems = _ingress_problems(
                cluster_name, spec, _policies_in(resources, _known(namespace)), vpc_blocks
            )
        except _Unknown:
            continue
        if not problems:
            continue
        shown = name if isinstance(name, str) and not is_unknown(name) else ray.urn
        if kind == "RayCluster":
            fix = f"admit only the RayCluster's own pods (`podSelector: {{matchLabels: {{{RAY_CLUSTER_LABEL}: {name}}}}}`)"
        else:
            callers = "the KubeRay operator and the submitter" if kind == "RayJob" else "the KubeRay operator"
            fix = (
                f"select them by a label of their templates (e.g. app.kubernetes.io/instance): KubeRay names the "
                f"{kind}'s RayCluster {shown}-<5 random characters> and gives its pods no label of the {kind}'s; "
                f"admit only named peers (its own pods, and {callers}, which call the head, by namespace and pod labels)"
            )
        violations.append(
            (
                ray.urn,
                f"{kind} {shown} in namespace {namespace}: {'; '.join(problems)}. Every Ray pod serves jobs "
                f"(the dashboard agent on each, the head's Ray ports): {fix}",
            )
        )
    return violations


def _denies_by_default(policy: StackResource) -> bool:
    """Whether a policy selects every pod of its namespace for ingress and egress and admits nothing."""
    spec = _known(policy.props.get("spec"))
    selector = _known(dig(spec, "podSelector")) or {}
    every_pod = not _known(dig(selector, "matchLabels")) and not items(
        _known(dig(selector, "matchExpressions"))
    )
    no_rules = not items(_known(dig(spec, "ingress"))) and not items(_known(dig(spec, "egress")))
    return every_pod and {"Ingress", "Egress"} <= policy_types(spec) and no_rules


def _number(value: Any) -> int | None:
    """A port number (numbers reach a policy as floats); None for a named port."""
    if isinstance(value, str):
        return int(value) if value.isdigit() else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def wide_ports(port: Any) -> str | None:
    """How a `ports` entry admits as good as every port: no `port`, or a range (`endPort`) of
    1024 ports or more or one reaching 65535; None when it names a port or a narrower range."""
    start, end = _known(dig(port, "port")), _known(dig(port, "endPort"))
    if start is None:
        return "every port"
    first, last = _number(start), _number(end)
    if first is None or last is None or last < first:
        return None
    if last >= HIGHEST_PORT or last - first + 1 >= WIDE_PORT_RANGE:
        return f"ports {first}-{last} (as good as every port)"
    return None


def _open_egress(policy: StackResource, vpc_blocks: Sequence[Any]) -> list[str]:
    """Egress rules of a policy that admit (as good as) every port to more than named peers."""
    found = []
    for index, rule in enumerate(items(_known(dig(policy.props, "spec", "egress")))):
        ports = items(_known(dig(rule, "ports")))
        wide = next(filter(None, map(wide_ports, ports)), None) if ports else "every port"
        if wide is None:
            continue
        why = _open_rule(rule, "to", vpc_blocks)
        if why:
            found.append(
                f"NetworkPolicy {_policy_name(policy)} admits egress on {wide} to {why} (egress rule {index})"
            )
    return found


@stack_rule(
    "ray-namespace-default-deny",
    MANDATORY,
    description="Every namespace holding Ray pods denies all ingress and egress by default.",
    resources="RayCluster/RayJob/RayService, NetworkPolicies and VPCs",
    requires=f"a NetworkPolicy in each namespace of a RayCluster, RayJob or RayService selects every pod (`podSelector: {{}}`) for `Ingress` and `Egress` with no rules; no NetworkPolicy there admits egress on every port (no `ports`, an entry without `port`, or a range `port`-`endPort` of {WIDE_PORT_RANGE} ports or more or reaching {HIGHEST_PORT}) to everyone (no `to`, a namespace selector that names no namespace, an ipBlock of every address or holding a VPC's addresses)",
)
def ray_namespace_default_deny(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """A namespace of Ray pods lets nothing in or out but what its policies name: a pod no other
    policy selects is cut off, and a Ray pod reaches only the destinations and ports its rules list."""
    vpc_blocks = _vpc_blocks(resources)
    namespaces: dict[Any, StackResource] = {}
    for resource in resources:
        namespace = dig(resource.props, "metadata", "namespace")
        if ray_cluster_spec(resource.type, resource.props) is not None and not is_unknown(namespace):
            namespaces.setdefault(namespace, resource)
    violations = []
    for namespace, ray in namespaces.items():
        try:
            policies = _policies_in(resources, namespace)
            problems = (
                []
                if any(_denies_by_default(p) for p in policies)
                else [
                    "no NetworkPolicy selects every pod (`podSelector: {}`) for Ingress and Egress with no rules"
                ]
            )
            problems += [problem for policy in policies for problem in _open_egress(policy, vpc_blocks)]
        except _Unknown:
            continue
        if problems:
            violations.append(
                (
                    ray.urn,
                    f"namespace {namespace} holds Ray pods: {'; '.join(problems)}. Deny everything by default "
                    "and allow each Ray pod only what its job needs",
                )
            )
    return violations
