"""Kubernetes objects and Helm values as pure functions returning plain dicts, one module per kind.

Nothing here talks to Pulumi or a cluster, so tests validate every object against the real
schemas (Kubernetes core, the KubeRay CRD, the charts' values.yaml). The Pulumi wiring in
`workloads.addons` and `workloads.ray_cluster` only hands these dicts over. As KubeRay lays out its
builders, each kind has its own module: `charts` (Helm values), `crd`, `kuberay_namespace`, `ray_namespace`,
`ray_service_account`, `secret`, `code_configmap` (the training code), `raycluster`, `network_policy`,
`head_disruption_budget` (the head's PodDisruptionBudget and its pod's autoscaler annotation), and
`pod_labels` (the labels KubeRay puts on the Ray pods, and their selectors). The names the
program's callers use are re-exported here.
"""

from workloads.manifests.charts import (
    EFA_DEVICE_PLUGIN,
    INSTANCE_TYPE_LABEL,
    KUBE_SYSTEM,
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    Chart,
    efa_device_plugin_values,
    kuberay_operator_values,
    nvidia_device_plugin_values,
)
from workloads.manifests.code_configmap import (
    CODE_HASH_FILE,
    CODE_MOUNT,
    code_hash,
    code_volume,
    collect_code,
    training_code_configmap,
)
from workloads.manifests.crd import (
    KUBERAY_CRD_DIR,
    KUBERAY_CRD_FILES,
    PATCH_FORCE_ANNOTATION,
    kuberay_crds,
)
from workloads.manifests.head_disruption_budget import SAFE_TO_EVICT_ANNOTATION, head_disruption_budget
from workloads.manifests.kuberay_namespace import KUBERAY_POD_SECURITY_LABELS, kuberay_namespace
from workloads.manifests.network_policy import (
    namespace_default_deny,
    ray_pods_network_policy,
)
from workloads.manifests.pod_labels import (
    RAY_CLUSTER_LABEL,
    RAY_NODE_TYPE_LABEL,
    head_pod_labels,
    head_pod_selector,
    ray_cluster_pod_labels,
    worker_pod_selector,
)
from workloads.manifests.ray_namespace import POD_SECURITY_LABELS, namespace
from workloads.manifests.ray_service_account import service_account
from workloads.manifests.raycluster import (
    DRAIN_TIMEOUT_ENV,
    RAY_AUTH_OPTIONS,
    RAY_LOGS_VOLUME,
    RAY_TMP_DIR,
    SPEC_HASH_ANNOTATION,
    RayClusterSpec,
    ray_auth_token_command,
    ray_cluster,
    spec_hash,
)
from workloads.manifests.secret import HF_TOKEN_SECRET, hf_token_secret

__all__ = [
    "CODE_HASH_FILE",
    "CODE_MOUNT",
    "DRAIN_TIMEOUT_ENV",
    "EFA_DEVICE_PLUGIN",
    "HF_TOKEN_SECRET",
    "INSTANCE_TYPE_LABEL",
    "KUBERAY_CRD_DIR",
    "KUBERAY_CRD_FILES",
    "KUBERAY_OPERATOR",
    "KUBERAY_POD_SECURITY_LABELS",
    "KUBE_SYSTEM",
    "NVIDIA_DEVICE_PLUGIN",
    "PATCH_FORCE_ANNOTATION",
    "POD_SECURITY_LABELS",
    "RAY_AUTH_OPTIONS",
    "RAY_CLUSTER_LABEL",
    "RAY_LOGS_VOLUME",
    "RAY_NODE_TYPE_LABEL",
    "RAY_TMP_DIR",
    "SAFE_TO_EVICT_ANNOTATION",
    "SPEC_HASH_ANNOTATION",
    "Chart",
    "RayClusterSpec",
    "code_hash",
    "code_volume",
    "collect_code",
    "efa_device_plugin_values",
    "head_disruption_budget",
    "head_pod_labels",
    "head_pod_selector",
    "hf_token_secret",
    "kuberay_crds",
    "kuberay_namespace",
    "kuberay_operator_values",
    "namespace",
    "namespace_default_deny",
    "nvidia_device_plugin_values",
    "ray_auth_token_command",
    "ray_cluster",
    "ray_cluster_pod_labels",
    "ray_pods_network_policy",
    "service_account",
    "spec_hash",
    "training_code_configmap",
    "worker_pod_selector",
]
