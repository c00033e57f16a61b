"""The RayCluster: Ray's ports kept inside the cluster, its workers QoS Guaranteed, its pods without a
Kubernetes API token (its NetworkPolicies: `ray_network`); the KubeRay operator confined to the
namespaces it watches."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from .properties import (
    HELM_INSTALLS,
    SERVICE,
    dig,
    is_false,
    is_true,
    is_unknown,
    items,
    type_kind,
)
from .registry import MANDATORY, resource_rule

# Ports of the Ray head that must stay inside the cluster: GCS, dashboard (job submission), client.
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
_RAY_PORTS_NAMED = f"Ray's GCS ({RAY_PORTS['gcs-server']}), dashboard ({RAY_PORTS['dashboard']}) or client ({RAY_PORTS['client']}) ports"

EXTERNAL_SERVICE_TYPES = {"LoadBalancer", "NodePort"}

# The labels KubeRay puts on a RayCluster's pods (the program's `workloads.manifests`).
RAY_CLUSTER_LABEL = "ray.io/cluster"

RAY_NODE_TYPE_LABEL = "ray.io/node-type"


def ray_cluster_spec(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The RayCluster spec inside a KubeRay RayCluster, RayJob or RayService; None for anything else."""
    module, kind = type_kind(resource_type)
    if not module.startswith("ray.io/"):
        return None
    spec = props.get("spec")
    inner = {
        "RayCluster": spec,
        "RayJob": dig(spec, "rayClusterSpec"),
        "RayService": dig(spec, "rayClusterConfig"),
    }
    found = inner.get(kind)
    return found if isinstance(found, Mapping) else None


def _ray_port_in(port: Mapping[str, Any]) -> int | str | None:
    """The Ray port a Service port forwards (by number or container port name), if any."""
    for value in (dig(port, "port"), dig(port, "targetPort")):
        if isinstance(value, str) and value in RAY_PORTS:
            return value
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        # Numbers reach a policy as floats (JSON through protobuf).
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in RAY_PORTS.values():
            return int(value)
    return None


_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")

_QUANTITY_FACTORS = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def _worker_groups(spec: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Each worker group of a RayCluster spec with the label messages name it by: its `groupName`, or
    `#<index>` while that is unknown or missing."""
    groups = []
    for index, group in enumerate(items(spec.get("workerGroupSpecs"))):
        name = dig(group, "groupName")
        groups.append((name if isinstance(name, str) and not is_unknown(name) else f"#{index}", group))
    return groups


def _quantity(value: Any) -> Decimal | str:
    """A Kubernetes quantity as a number (so "40" equals 40 and "1Gi" equals "1024Mi"); else its text."""
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match:
        return Decimal(match.group(1)) * _QUANTITY_FACTORS[match.group(2)]
    try:
        return Decimal(text)  # decimal exponent form, e.g. 1e3
    except InvalidOperation:
        return text


def _container_resource_gaps(container: Mapping[str, Any]) -> list[str]:
    """Why a container is not QoS Guaranteed: a resource whose effective request differs from its limit.

    Kubernetes fills a missing request from the limit, so only limits are required; CPU and memory
    limits are, because without them the pod is not Guaranteed whatever else it sets.
    """
    resources = dig(container, "resources")
    if is_unknown(resources):
        return []
    requests, limits = dig(resources, "requests"), dig(resources, "limits")
    if is_unknown(requests) or is_unknown(limits):
        return []
    requests = requests if isinstance(requests, Mapping) else {}
    limits = limits if isinstance(limits, Mapping) else {}
    gaps = [f"no {name} limit" for name in ("cpu", "memory") if name not in limits]
    for name in sorted(set(requests) | set(limits)):
        request, limit = requests.get(name, limits.get(name)), limits.get(name)
        if is_unknown(request) or is_unknown(limit):
            continue
        if limit is None:
            gaps.append(f"{name} requested ({request}) without a limit")
        elif _quantity(request) != _quantity(limit):
            gaps.append(f"{name} request {request} != limit {limit}")
    return gaps


@resource_rule(
    "ray-ports-not-exposed",
    MANDATORY,
    description=f"No LoadBalancer or NodePort Service for {_RAY_PORTS_NAMED}.",
    resources="Services, RayCluster/RayJob/RayService",
    requires=f"no LoadBalancer or NodePort Service for {_RAY_PORTS_NAMED}; the Ray head Service stays ClusterIP (use `kubectl port-forward`)",
)
def ray_ports_not_exposed(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Ray's GCS, dashboard and client ports accept jobs without authentication: cluster-internal only."""
    violations = []
    if resource_type == SERVICE:
        service_type = dig(props, "spec", "type")
        if service_type in EXTERNAL_SERVICE_TYPES:
            exposed = sorted(
                {str(p) for p in map(_ray_port_in, items(dig(props, "spec", "ports"))) if p is not None}
            )
            if exposed:
                violations.append(
                    f"a {service_type} Service exposes Ray port(s) {', '.join(exposed)} outside the cluster: "
                    "use ClusterIP and `kubectl port-forward`"
                )
    spec = ray_cluster_spec(resource_type, props)
    if spec is not None:
        head = spec.get("headGroupSpec")
        for where, value in (
            ("headGroupSpec.serviceType", dig(head, "serviceType")),
            ("headGroupSpec.headService.spec.type", dig(head, "headService", "spec", "type")),
        ):
            if value in EXTERNAL_SERVICE_TYPES:
                violations.append(
                    f"{where} is {value}: the head Service would expose the Ray dashboard and GCS outside the cluster; "
                    "use ClusterIP and `kubectl port-forward`"
                )
    return violations


@resource_rule(
    "ray-worker-requests-equal-limits",
    MANDATORY,
    description="Ray worker containers request exactly their limits (QoS Guaranteed).",
    resources="RayCluster/RayJob/RayService worker groups",
    requires="every worker container's requests equal its limits, with CPU and memory limits set (QoS Guaranteed)",
)
def ray_workers_guaranteed(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Ray worker containers request exactly their limits, so each pod owns its node's GPUs, EFA, CPU, memory."""
    spec = ray_cluster_spec(resource_type, props)
    if spec is None:
        return []
    violations = []
    for label, group in _worker_groups(spec):
        for container in items(dig(group, "template", "spec", "containers")):
            gaps = _container_resource_gaps(container)
            if gaps:
                violations.append(
                    f"worker group {label}, container {dig(container, 'name')}: {'; '.join(gaps)}. "
                    "Set requests equal to limits (QoS Guaranteed)"
                )
    return violations


@resource_rule(
    "ray-pods-without-api-token",
    MANDATORY,
    description="Ray pods mount no Kubernetes service account token.",
    resources="RayCluster/RayJob/RayService pod templates",
    requires="the head's and every worker group's pod template sets `automountServiceAccountToken: false`; the head's may leave it out only with `enableInTreeAutoscaling: true`, whose autoscaler calls the Kubernetes API",
)
def ray_pods_without_api_token(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Ray pods never call the Kubernetes API (the job, Ray and the TrainingRun's exec need none of it),
    so a token in them would only serve whoever runs code there. A token mounted by default
    (`automountServiceAccountToken` unset) is the service account's; the pod's own `false` holds
    whatever the service account says. Only KubeRay's in-tree autoscaler, a container of the head,
    calls the API (kuberay v1.7.0 ray-operator/controllers/ray/common/pod.go, `IsAutoscalingEnabled`)."""
    spec = ray_cluster_spec(resource_type, props)
    if spec is None:
        return []
    autoscaling = spec.get("enableInTreeAutoscaling")
    templates = [
        (f"worker group {label}", dig(group, "template", "spec")) for label, group in _worker_groups(spec)
    ]
    if not (is_true(autoscaling) or is_unknown(autoscaling)):
        templates.insert(0, ("the head", dig(spec, "headGroupSpec", "template", "spec")))
    violations = []
    for who, pod in templates:
        mount = dig(pod, "automountServiceAccountToken")
        if not (is_false(mount) or is_unknown(mount)):
            violations.append(
                f"{who}'s pod template does not set automountServiceAccountToken: false, so its pods hold a "
                "Kubernetes API token they never use: set it (IRSA mounts its own token regardless)"
            )
    return violations


# The KubeRay operator's chart (the program's `workloads.manifests.KUBERAY_OPERATOR`), and the value of
# its values.yaml that binds the operator to a Role in each namespace of `watchNamespace` rather than a
# ClusterRole (kuberay helm-chart/kuberay-operator, templates/role.yaml and multiple_namespaces_role.yaml).
KUBERAY_CHART = "kuberay-operator"
NAMESPACE_SCOPED_VALUE = "singleNamespaceInstall"


@resource_rule(
    "kuberay-operator-namespace-scoped",
    MANDATORY,
    description="The KubeRay operator's chart is installed namespace-scoped: a Role in the namespaces it watches, no ClusterRole over every namespace's Secrets, pods and RBAC.",
    resources="Helm releases and v4 Charts of the `kuberay-operator` chart",
    requires="`values.singleNamespaceInstall: true` (with `watchNamespace` naming the RayClusters' namespaces), so the chart binds the operator to a Role in each watched namespace instead of a ClusterRole",
)
def kuberay_operator_namespace_scoped(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """By default the chart binds the operator to a ClusterRole: it reads and writes Secrets, creates
    pods, Roles, RoleBindings and NetworkPolicies, and deletes them, in every namespace of the cluster.
    Namespace-scoped, the same rules hold in the watched namespaces alone. A chart named by its
    repository or an OCI path (`kuberay/kuberay-operator`) counts by its last part."""
    chart = props.get("chart")
    if resource_type not in HELM_INSTALLS or not isinstance(chart, str) or is_unknown(chart):
        return []
    if chart.rstrip("/").rsplit("/", 1)[-1] != KUBERAY_CHART:
        return []
    scoped = dig(props, "values", NAMESPACE_SCOPED_VALUE)
    if is_unknown(scoped) or is_true(scoped):
        return []
    current = "not set" if scoped is None else repr(scoped)
    return [
        f"values.{NAMESPACE_SCOPED_VALUE} is {current}: set it true, with watchNamespace naming the "
        "RayClusters' namespaces, so the operator gets a Role there instead of a ClusterRole over every "
        "namespace's Secrets and pods"
    ]
