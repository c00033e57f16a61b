"""Pods: namespaces that refuse privileged pods, containers on pinned images."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .properties import (
    NAMESPACE,
    StackResource,
    dig,
    is_true,
    is_unknown,
    items,
)
from .registry import MANDATORY, resource_rule, stack_rule

# The Pod Security admission label that refuses pods, and the levels that refuse privileged ones.
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"

POD_SECURITY_WARN = "pod-security.kubernetes.io/warn"

POD_SECURITY_AUDIT = "pod-security.kubernetes.io/audit"

ENFORCED_LEVELS = ("baseline", "restricted")


def pod_containers(value: Any) -> list[Mapping[str, Any]]:
    """Every container of every pod template anywhere inside a Kubernetes object (Pods, workloads, Ray CRs)."""
    found: list[Mapping[str, Any]] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("containers", "initContainers", "ephemeralContainers"):
                found.extend(c for c in items(item) if isinstance(c, Mapping))
            else:
                found.extend(pod_containers(item))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            found.extend(pod_containers(item))
    return found


def pod_specs(value: Any) -> list[Mapping[str, Any]]:
    """Every pod spec (a mapping with `containers`) anywhere inside a Kubernetes object."""
    if isinstance(value, Mapping):
        own = [value] if "containers" in value else []
        return own + [spec for item in value.values() for spec in pod_specs(item)]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [spec for item in value for spec in pod_specs(item)]
    return []


# What follows `@` in a digest reference: `<algorithm>:<hex>` (OCI image spec, descriptor digests).
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}")


def image_pin_problem(image: str) -> str | None:
    """Why an image reference is not pinned (no tag, or `latest`), or None when it has a tag or digest."""
    name, at, digest = image.partition("@")
    if at:
        return None if _DIGEST.fullmatch(digest) else "has a malformed digest"
    last_segment = name.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return "has no tag (so it means latest)"
    if last_segment.rsplit(":", 1)[1] == "latest":
        return "is tagged latest"
    return None


def beyond_host_network(spec: Mapping[str, Any]) -> list[str]:
    """What a pod spec asks for that Pod Security `baseline` refuses, other than `hostNetwork`
    (Kubernetes "Pod Security Standards", baseline: host PID/IPC, host paths and ports, privileged
    containers, added capabilities, unconfined seccomp, proc mount, sysctls)."""
    found = [f"{key}: true" for key in ("hostPID", "hostIPC") if is_true(spec.get(key))]
    found += [
        f"volume {v.get('name')} is a hostPath"
        for v in items(spec.get("volumes"))
        if isinstance(v, Mapping) and "hostPath" in v
    ]
    if items(dig(spec, "securityContext", "sysctls")):
        found.append("sysctls")
    if dig(spec, "securityContext", "seccompProfile", "type") == "Unconfined":
        found.append("an unconfined seccomp profile")
    for container in pod_containers(spec):
        name, context = container.get("name"), container.get("securityContext") or {}
        if is_true(dig(context, "privileged")):
            found.append(f"container {name} is privileged")
        if items(dig(context, "capabilities", "add")):
            found.append(f"container {name} adds capabilities")
        if dig(context, "procMount") not in (None, "Default"):
            found.append(f"container {name} mounts /proc unmasked")
        if dig(context, "seccompProfile", "type") == "Unconfined":
            found.append(f"container {name} runs without seccomp")
        if any(isinstance(port, Mapping) and port.get("hostPort") for port in items(container.get("ports"))):
            found.append(f"container {name} takes a host port")
    return found


@resource_rule(
    "container-images-pinned",
    MANDATORY,
    description="Container images are pinned to a tag (not latest) or a digest.",
    resources="any Kubernetes object with a pod template (Pods, workloads, Ray CRs)",
    requires="every image has a tag other than `latest`, or a digest",
)
def container_images_pinned(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Containers run a fixed image: a tag other than latest, or a digest, so every node runs the same bits."""
    if not resource_type.startswith("kubernetes:"):
        return []
    violations = []
    for container in pod_containers(props):
        image = container.get("image")
        if not isinstance(image, str) or is_unknown(image):
            continue
        problem = image_pin_problem(image)
        if problem:
            violations.append(
                f"container {container.get('name')}: image {image} {problem}; pin a version tag or an @sha256 digest"
            )
    return violations


@stack_rule(
    "namespace-pod-security-enforced",
    MANDATORY,
    description="Every namespace enforces the baseline or restricted Pod Security Standard, but one for host-network pods alone, which warns and audits at baseline.",
    resources="Namespaces and the pods the stack puts in them",
    requires="the label `pod-security.kubernetes.io/enforce` is `baseline` or `restricted`; or `privileged` for a namespace of host-network pods alone: it warns and audits at `baseline` or stricter, and the stack's pods there ask for nothing `baseline` refuses but `hostNetwork`",
)
def namespace_pod_security(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every namespace the stack creates refuses privileged pods (Pod Security `baseline` or stricter).

    The one exception is a namespace for pods that need the host's network namespace (a node agent
    such as an EFA counter reader, which `baseline` refuses): it may enforce `privileged` when it
    still warns and audits at `baseline` or stricter, so any other pod admitted there is flagged, and
    the stack puts pods there that ask for nothing beyond `hostNetwork` (`beyond_host_network`)."""
    violations = []
    for namespace in (r for r in resources if r.type == NAMESPACE):
        labels = dig(namespace.props, "metadata", "labels")
        name = dig(namespace.props, "metadata", "name")
        if is_unknown(labels) or is_unknown(name):
            continue
        level = dig(labels, POD_SECURITY_ENFORCE)
        if is_unknown(level) or level in ENFORCED_LEVELS:
            continue
        current = "not set" if level is None else repr(level)
        refusal = (
            f"label {POD_SECURITY_ENFORCE} is {current}: set it to baseline or restricted so the namespace "
            "refuses privileged pods, host namespaces and host paths"
        )
        if level != "privileged":
            violations.append((namespace.urn, refusal))
            continue
        problems = _host_network_namespace_problems(resources, labels, name)
        if problems:
            violations.append(
                (
                    namespace.urn,
                    f"{refusal}; a namespace for host-network pods may enforce privileged only when "
                    + "; ".join(problems),
                )
            )
    return violations


def _host_network_namespace_problems(
    resources: Sequence[StackResource], labels: Mapping[str, Any], name: str
) -> list[str]:
    """Why a `privileged` namespace is not one for host-network pods alone (empty: it is)."""
    problems = [
        f"it {label.rsplit('/', 1)[1]}s at baseline or restricted (label {label} is {dig(labels, label)!r})"
        for label in (POD_SECURITY_WARN, POD_SECURITY_AUDIT)
        if dig(labels, label) not in ENFORCED_LEVELS
    ]
    pods = [
        spec
        for resource in resources
        if resource.type.startswith("kubernetes:") and dig(resource.props, "metadata", "namespace") == name
        for spec in pod_specs(resource.props)
    ]
    if not pods:
        problems.append("the stack puts host-network pods in it (it puts none)")
    for spec in pods:
        if not is_true(spec.get("hostNetwork")):
            problems.append("each of its pods uses the host's network (one does not)")
        problems += [f"its pods ask for nothing else ({found})" for found in beyond_host_network(spec)]
    return problems
