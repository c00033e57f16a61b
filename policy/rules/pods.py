"""Pods: namespaces that refuse privileged pods, Helm charts only in namespaces the stack declares,
containers on pinned images (by digest outside dev stacks)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .properties import (
    DAEMONSET,
    HELM_INSTALLS,
    NAMESPACE,
    StackResource,
    dig,
    is_dev_stack,
    is_false,
    is_true,
    is_unknown,
    items,
    type_kind,
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


def pod_templates(value: Any, metadata: Any = None) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(metadata, spec) of every pod spec anywhere inside a Kubernetes object: a mapping whose
    `containers` is a list (or unknown), not the mapping of that name a CRD's schema holds under
    `properties`; the metadata is the one beside it under `spec` (a Pod's own, a template's), empty
    where none."""
    if isinstance(value, Mapping):
        is_spec = "containers" in value and not isinstance(value["containers"], Mapping)
        own = [(metadata if isinstance(metadata, Mapping) else {}, value)] if is_spec else []
        return own + [
            template
            for key, item in value.items()
            for template in pod_templates(item, value.get("metadata") if key == "spec" else None)
        ]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [template for item in value for template in pod_templates(item)]
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


# A sha256 digest, the algorithm registries compute manifests' digests with: `sha256:` and 64
# lowercase hex digits (OCI image spec, descriptor.md, "Registered algorithms").
_SHA256_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


def image_digest_problem(image: str) -> str | None:
    """Why an image reference does not name its bits by a sha256 digest, or None when it does."""
    _, at, digest = image.partition("@")
    if not at:
        return "is a tag, which its publisher can move to other bits"
    if not _SHA256_DIGEST.fullmatch(digest):
        return "has a digest other than sha256:<64 lowercase hex digits>"
    return None


# Kubernetes "Pod Security Standards" (kubernetes.io/docs/concepts/security/pod-security-standards/),
# baseline, AppArmor: the `appArmorProfile.type` of the pod and of each container is undefined,
# RuntimeDefault or Localhost; the older annotation `container.apparmor.security.beta.kubernetes.io/*`
# is undefined, empty, `runtime/default` or `localhost/<profile>`.
APPARMOR_TYPES = (None, "RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
# Baseline, SELinux: `seLinuxOptions.type` is undefined, empty or one of these container types
# (container_engine_t since Kubernetes 1.31); `seLinuxOptions.user` and `.role` are undefined or empty.
SELINUX_TYPES = (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")


def _shown(value: Any) -> str:
    """A refused value as a message quotes it (the engine's placeholder for an unknown one is no help)."""
    return "unknown during preview" if is_unknown(value) else repr(value)


def _apparmor_annotation_allowed(profile: Any) -> bool:
    return profile in ("", "runtime/default") or (
        isinstance(profile, str) and not is_unknown(profile) and profile.startswith("localhost/")
    )


def _confinement_refused(who: str, context: Any) -> list[str]:
    """The AppArmor and SELinux settings of one security context (the pod's or a container's) that
    Pod Security `baseline` refuses."""
    found = []
    apparmor = dig(context, "appArmorProfile", "type")
    if apparmor not in APPARMOR_TYPES:
        found.append(f"{who} sets AppArmor profile type {_shown(apparmor)}")
    selinux_type = dig(context, "seLinuxOptions", "type")
    if selinux_type not in SELINUX_TYPES:
        found.append(f"{who} sets SELinux type {_shown(selinux_type)}")
    found += [
        f"{who} sets an SELinux {option}"
        for option in ("user", "role")
        if dig(context, "seLinuxOptions", option) not in (None, "")
    ]
    return found


def beyond_host_network(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """What a pod (its metadata and spec) asks for that Pod Security `baseline` refuses, other than
    `hostNetwork` (Kubernetes "Pod Security Standards", baseline: host PID/IPC, host paths and ports,
    privileged containers, added capabilities, AppArmor, SELinux, proc mount, unconfined seccomp,
    sysctls)."""
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
    found += _confinement_refused("the pod", dig(spec, "securityContext"))
    annotations = dig(metadata, "annotations")
    if isinstance(annotations, Mapping):
        found += [
            f"annotation {key} is {_shown(profile)}"
            for key, profile in annotations.items()
            if key.startswith(APPARMOR_ANNOTATION) and not _apparmor_annotation_allowed(profile)
        ]
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
        found += _confinement_refused(f"container {name}", context)
        if any(isinstance(port, Mapping) and port.get("hostPort") for port in items(container.get("ports"))):
            found.append(f"container {name} takes a host port")
    return found


def unhardened(spec: Mapping[str, Any]) -> list[str]:
    """What a pod spec leaves out of the EFA counter reader's hardening, which a pod of a `privileged`
    host-network namespace must have: no service account token (`automountServiceAccountToken: false`,
    Kubernetes "Configure Service Accounts for Pods"); and in each container, a non-root user
    (`runAsNonRoot: true`, its own or else the pod's) with every capability dropped and no privilege
    escalation (Kubernetes "Pod Security Standards", restricted: Running as Non-root, Capabilities,
    Privilege Escalation), and a read-only root filesystem (`readOnlyRootFilesystem` of the Kubernetes
    API's SecurityContext)."""
    found = []
    if not is_false(spec.get("automountServiceAccountToken")):
        found.append("a pod does not set automountServiceAccountToken: false")
    pod_non_root = dig(spec, "securityContext", "runAsNonRoot")
    for container in pod_containers(spec):
        context = container.get("securityContext") or {}
        own_non_root = dig(context, "runAsNonRoot")
        missing = [
            setting
            for setting, held in (
                ("runAsNonRoot: true", is_true(pod_non_root if own_non_root is None else own_non_root)),
                ("capabilities.drop: [ALL]", "ALL" in items(dig(context, "capabilities", "drop"))),
                ("readOnlyRootFilesystem: true", is_true(dig(context, "readOnlyRootFilesystem"))),
                ("allowPrivilegeEscalation: false", is_false(dig(context, "allowPrivilegeEscalation"))),
            )
            if not held
        ]
        if missing:
            found.append(f"container {container.get('name')} does not set {', '.join(missing)}")
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
    return [
        f"container {name}: image {image} {problem}; pin a version tag or an @sha256 digest"
        for name, image, problem in _image_problems(props, image_pin_problem)
    ]


def _image_problems(
    props: Mapping[str, Any], problem_of: Callable[[str], str | None]
) -> list[tuple[Any, str, str]]:
    """(container name, image, problem) for each container whose known image `problem_of` faults."""
    found = []
    for container in pod_containers(props):
        image = container.get("image")
        if isinstance(image, str) and not is_unknown(image) and (problem := problem_of(image)):
            found.append((container.get("name"), image, problem))
    return found


@resource_rule(
    "container-images-digest-pinned",
    MANDATORY,
    description="Outside dev stacks, container images are pinned by a sha256 digest.",
    resources="any Kubernetes object with a pod template (Pods, workloads, Ray CRs), in stacks other than dev (`dev`, `dev-*`, `*-dev`)",
    requires="every image names its bits by digest (`<repository>@sha256:<digest>`): a tag can be moved to other bits, so a node replaced later could run other bits than the rest; dev stacks may run tags",
)
def container_images_digest_pinned(resource_type: str, props: Mapping[str, Any], stack: str) -> list[str]:
    """Outside dev stacks every container runs the bits of a digest, which its publisher cannot move as
    it can a tag; Helm releases are not read (their charts' pods are not visible to the pack)."""
    if not resource_type.startswith("kubernetes:") or is_dev_stack(stack):
        return []
    return [
        f"container {name}: image {image} {problem}, and stack {stack} is not a dev stack: pin it as "
        "<repository>@sha256:<digest> (the program's preview reads it from the registry for its own pods)"
        for name, image, problem in _image_problems(props, image_digest_problem)
    ]


@stack_rule(
    "namespace-pod-security-enforced",
    MANDATORY,
    description="Every namespace enforces the baseline or restricted Pod Security Standard, but one for hardened host-network node agents alone, which warns and audits at baseline.",
    resources="Namespaces, and the stack's pod templates and Helm, YAML and kustomize resources",
    requires="the label `pod-security.kubernetes.io/enforce` is `baseline` or `restricted`; or `privileged` for a namespace of host-network node agents alone: it warns and audits at `baseline` or stricter; the stack's pods there are DaemonSets' that ask for nothing `baseline` refuses (AppArmor and SELinux included) but `hostNetwork`, set `automountServiceAccountToken: false` and `runAsNonRoot: true` (the pod or each container), and in every container `capabilities.drop: [ALL]`, `readOnlyRootFilesystem: true` and `allowPrivilegeEscalation: false`; no Helm, YAML or kustomize resource names it as its namespace, an unknown namespace or none; and every pod template of the stack names a known namespace",
)
def namespace_pod_security(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """Every namespace the stack creates refuses privileged pods (Pod Security `baseline` or stricter).

    The one exception is a namespace for node agents that need the host's network namespace (the EFA
    counter reader, which `baseline` refuses): it may enforce `privileged` when it still warns and
    audits at `baseline` or stricter, so any other pod admitted there is flagged, and the stack's pods
    there are the reader's kind alone: DaemonSets' pods that ask for nothing beyond `hostNetwork`
    (`beyond_host_network`) and are hardened as the reader is (`unhardened`). A pod in the host's
    network namespace that runs as root with the runtime's default capabilities (NET_RAW among them)
    reaches the instance metadata service despite the hop limit of 1, which holds only for pods in
    their own network namespace, and with it the node role's credentials.

    Nothing may reach such a namespace unseen: a Helm release installs its chart with Helm's own
    client, so its objects never reach the engine, and chart, YAML and kustomize resources hold their
    pods in charts and files the pack does not read; and a pod template whose namespace is unknown
    during preview, or unset (the provider's default namespace), may land in it."""
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
                    f"{refusal}; a namespace for host-network node agents may enforce privileged only when "
                    + "; ".join(problems),
                )
            )
    return violations


# pulumi-kubernetes modules whose resources install objects the pack does not see: Helm releases and
# charts, YAML files and groups, kustomize directories (`kubernetes:helm.sh/v3:Release`,
# `kubernetes:yaml/v2:ConfigGroup`, ...).
MANIFEST_BUNDLES = ("helm.sh", "yaml", "kustomize")


def _named(resource: StackResource) -> str:
    """A resource as a message names it: its kind and its Pulumi name (the URN's last part)."""
    return f"{type_kind(resource.type)[1]} {resource.urn.rsplit('::', 1)[-1]}"


def _unresolved(namespace: Any) -> str | None:
    """How a namespace property fails to name a namespace (None: it names one)."""
    if is_unknown(namespace):
        return "an unknown namespace"
    if not isinstance(namespace, str) or not namespace:
        return "no namespace"
    return None


def _host_network_namespace_problems(
    resources: Sequence[StackResource], labels: Mapping[str, Any], name: str
) -> list[str]:
    """Why a `privileged` namespace is not one for hardened host-network node agents alone (empty: it is)."""
    problems = [
        f"it {label.rsplit('/', 1)[1]}s at baseline or restricted (label {label} is {dig(labels, label)!r})"
        for label in (POD_SECURITY_WARN, POD_SECURITY_AUDIT)
        if dig(labels, label) not in ENFORCED_LEVELS
    ]
    pods: list[tuple[StackResource, list[tuple[Mapping[str, Any], Mapping[str, Any]]]]] = []
    for resource in resources:
        if not resource.type.startswith("kubernetes:"):
            continue
        if type_kind(resource.type)[0].split("/")[0] in MANIFEST_BUNDLES:
            target = resource.props.get("namespace")
            if target == name or _unresolved(target):
                problems.append(
                    f"no Helm, YAML or kustomize resource installs into it, since the pack cannot see "
                    f"their pods ({_named(resource)} names {_unresolved(target) or 'it'})"
                )
            continue
        templates = pod_templates(resource.props)
        if not templates:
            continue
        namespace = dig(resource.props, "metadata", "namespace")
        unresolved = _unresolved(namespace)
        if unresolved:
            problems.append(
                f"every pod template of the stack names a known namespace, so that none lands in it "
                f"unchecked ({_named(resource)} names {unresolved})"
            )
        elif namespace == name:
            pods.append((resource, templates))
    if not pods:
        problems.append("the stack puts host-network pods in it (it puts none)")
    for resource, templates in pods:
        if resource.type != DAEMONSET:
            problems.append(f"its pods come from DaemonSets alone ({_named(resource)} is not a DaemonSet)")
        for metadata, spec in templates:
            if not is_true(spec.get("hostNetwork")):
                problems.append("each of its pods uses the host's network (one does not)")
            problems += [
                f"its pods ask for nothing else ({found})" for found in beyond_host_network(metadata, spec)
            ]
            problems += [
                f"its pods are hardened as the EFA counter reader's ({found})" for found in unhardened(spec)
            ]
    return problems


# EKS's own namespace, where the device plugins install: the cluster has it from the start, and the
# stack neither declares nor relabels it (the program's `workloads.manifests.KUBE_SYSTEM`).
KUBE_SYSTEM = "kube-system"


@stack_rule(
    "helm-namespaces-declared",
    MANDATORY,
    description="Helm charts create no namespace and install into kube-system or a namespace the stack declares, so namespace-pod-security-enforced judges every namespace their pods run in.",
    resources="Helm releases and v4 Charts, and Namespaces",
    requires="`createNamespace` is not true, and `namespace` is `kube-system` or the name of a Namespace of the stack (while that name is unknown during preview, one the release depends on)",
)
def helm_namespaces_declared(resources: Sequence[StackResource]) -> list[tuple[str, str]]:
    """A namespace Helm creates (`createNamespace`) carries no Pod Security label, so it admits
    privileged pods, and `namespace-pod-security-enforced`, which judges the stack's Namespaces,
    never sees it; the same holds for a namespace that exists for another reason (the provider's
    default namespace, one made by hand). So every chart installs into a Namespace of the stack,
    whose labels that rule checks, or into EKS's `kube-system`."""
    namespaces = [r for r in resources if r.type == NAMESPACE]
    names = {r.urn: dig(r.props, "metadata", "name") for r in namespaces}
    declared = {name for name in names.values() if _unresolved(name) is None}
    # A Namespace whose name is unknown during preview may be the one a release names.
    unnamed = {urn for urn, name in names.items() if is_unknown(name)}
    violations = []
    for resource in (r for r in resources if r.type in HELM_INSTALLS):
        if is_true(resource.props.get("createNamespace")):
            violations.append(
                (
                    resource.urn,
                    "createNamespace is true: Helm would create the namespace without Pod Security "
                    "labels; declare it as a Namespace of the stack, set createNamespace false and make "
                    "the release depend on the Namespace",
                )
            )
        target = resource.props.get("namespace")
        if is_unknown(target) or target == KUBE_SYSTEM or target in declared:
            continue
        if unnamed & set(resource.dependencies):
            continue
        named = (
            f"namespace {target!r} is not a Namespace of the stack"
            if _unresolved(target) is None
            else "namespace is not set, so the chart installs into the provider's default namespace, which is not a Namespace of the stack"
        )
        violations.append(
            (
                resource.urn,
                f"{named}: no Pod Security label of the stack holds its pods; declare the namespace as a "
                f"Namespace with Pod Security labels, or install into {KUBE_SYSTEM}",
            )
        )
    return violations
