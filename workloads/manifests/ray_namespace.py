"""The Ray namespace (Namespace), with the Pod Security Standards it enforces, warns and audits."""

from __future__ import annotations

from platform_contract import (
    PART_OF_LABELS,
)

# Pod Security Standards of the Ray namespace. The Ray pods meet `baseline` (no privilege, no host
# namespaces or paths; GPUs and EFA come as device-plugin resources). They miss `restricted` only by
# running as root, as AWS's Ray image does: `restricted` is enforced nowhere, but each pod that misses
# it is reported to whoever applies it (warn) and in the audit log (audit).
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
# What every Ray pod runs with: the runtime's default seccomp filter, no setuid escalation, and no


def namespace(name: str) -> dict:
    """The Ray namespace, admitting pods that meet the `baseline` Pod Security Standard."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {**PART_OF_LABELS, **POD_SECURITY_LABELS}},
    }
