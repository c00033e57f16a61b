"""The KubeRay operator's namespace (Namespace), declared by the program with the Pod Security Standard
it enforces, warns and audits, rather than created unlabelled by Helm (`createNamespace`)."""

from __future__ import annotations

from platform_contract import PART_OF_LABELS
from workloads.manifests.charts import KUBERAY_OPERATOR

# The operator's pod meets `restricted` (Kubernetes "Pod Security Standards"), control by control,
# with the pinned chart's values.yaml (`securityContext`, `podSecurityContext: {}`) and
# templates/deployment.yaml:
# - Privilege Escalation: `allowPrivilegeEscalation: false`;
# - Running as Non-root: `runAsNonRoot: true` (the container's); Running as Non-root user: no
#   `runAsUser` (the image runs as 65532, ray-operator/Dockerfile `USER 65532:65532`);
# - Seccomp: `seccompProfile.type: RuntimeDefault`;
# - Capabilities: `drop: [ALL]`, none added;
# - Volume Types: none by default, and the two the chart can add are an emptyDir (file logging) and a
#   configMap (`configuration.enabled`), both allowed; the service account token is projected;
# - and `baseline`'s: no host namespaces, hostPath or host port (container port 8080 alone), not
#   privileged, no AppArmor, SELinux, /proc mount or sysctl settings.
# So the namespace enforces `restricted`: a pod of a later chart that does not is refused, not run.
KUBERAY_POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


def kuberay_namespace() -> dict:
    """The namespace of the KubeRay operator's release, enforcing `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": KUBERAY_OPERATOR.namespace,
            "labels": {**PART_OF_LABELS, **KUBERAY_POD_SECURITY_LABELS},
        },
    }
