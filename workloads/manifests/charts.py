"""The pinned Helm charts (NVIDIA and EFA device plugins, KubeRay operator) and the values the program gives them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from platform_contract import (
    GPU_NODE_SELECTOR,
    GPU_TOLERATION,
    SYSTEM_NODE_SELECTOR,
)


@dataclass(frozen=True)
class Chart:
    """A pinned Helm chart, where it comes from, and the tag of its image, which the values set."""

    name: str
    version: str
    repository: str
    namespace: str
    # The chart's own image tag at this version (its values.yaml `image.tag`, or what its template
    # derives from `appVersion`), set in the values all the same, so the image a release runs is named
    # here and not left to a chart's default. Each of the three charts' templates writes
    # `<image.repository>:<image.tag>` and reads `image.tag` nowhere else (nvidia-device-plugin v0.20.0
    # templates/_helpers.tpl:83-86, `fullimage`; aws-efa-k8s-device-plugin v0.5.30
    # templates/daemonset.yaml:66; kuberay-operator v1.7.0 templates/deployment.yaml:68), so a tag of
    # `<tag>@sha256:<digest>` renders `<repository>:<tag>@sha256:<digest>`, which the runtime pulls by
    # its digest: outside a dev stack the values carry it (`pin_chart_images`).
    image_tag: str


# EKS's own namespace, which the device plugins install into (as AWS's Ray Train sample installs
# them): the cluster has it from the start, and the program neither declares nor relabels it. Every
# other namespace a release installs into is declared by the program with its Pod Security labels,
# and no release creates one (`createNamespace` false).
KUBE_SYSTEM = "kube-system"
NVIDIA_DEVICE_PLUGIN = Chart(
    "nvidia-device-plugin", "0.20.0", "https://nvidia.github.io/k8s-device-plugin", KUBE_SYSTEM, "v0.20.0"
)
# v0.5.30 is the newest release in the chart index of aws/eks-charts (checked 2026-08) and lists
# g6.12xlarge as supported; AWS's Ray Train sample names v0.5.32, which that index does not hold.
# Its image is the plugin's v0.5.20 (the chart's appVersion).
EFA_DEVICE_PLUGIN = Chart(
    "aws-efa-k8s-device-plugin", "v0.5.30", "https://aws.github.io/eks-charts", KUBE_SYSTEM, "v0.5.20"
)
KUBERAY_OPERATOR = Chart(
    "kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/", "kuberay", "v1.7.0"
)
# The images of the NVIDIA device plugin and the KubeRay operator (their values.yaml `image.repository`).
NVIDIA_DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
KUBERAY_OPERATOR_IMAGE = "quay.io/kuberay/operator"
# The node label the EFA chart's DaemonSet matches against `supportedInstanceLabels.values`.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Amazon EKS replicates its add-on images to a registry in each region (EKS user guide, "View Amazon
# container image registries for Amazon EKS add-ons"): account 602401143452 in most regions, these
# accounts in the others. The EFA chart's default image is us-west-2's.
EKS_REGISTRY_ACCOUNT = "602401143452"
EKS_REGISTRY_ACCOUNTS = {
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-south-2": "900889452093",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-6": "333609536671",
    "ap-southeast-7": "121268973566",
    "ca-west-1": "761377655185",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "eu-central-2": "900612956339",
    "eu-south-1": "590381155156",
    "eu-south-2": "455263428931",
    "il-central-1": "066635153087",
    "me-central-1": "759879836304",
    "me-south-1": "558608220178",
    "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608",
}
EFA_DEVICE_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"

# The chart images' references as they run, by their tag reference (`chart_images`): what the
# preview pinned (`infra.preflight.reads.image_digests.pin_images`, `<repository>:<tag>@sha256:<digest>`
# outside a dev stack). None or a reference left out: the tag.
ChartPins = Mapping[str, str] | None


def chart_images(region: str) -> dict[str, str]:
    """The three charts' images as their values name them (`<repository>:<tag>`), each by what sets it,
    as the preview's messages name it."""
    return {
        f"the image of chart {chart.name} {chart.version} (workloads/manifests/charts.py)": f"{repository}:{chart.image_tag}"
        for chart, repository in (
            (NVIDIA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN_IMAGE),
            (EFA_DEVICE_PLUGIN, efa_device_plugin_image(region)),
            (KUBERAY_OPERATOR, KUBERAY_OPERATOR_IMAGE),
        )
    }


def pinned_tag(repository: str, tag: str, pins: ChartPins) -> str:
    """The values' `image.tag` of `<repository>:<tag>`: the tag, or `<tag>@sha256:<digest>` once pinned."""
    reference = f"{repository}:{tag}"
    return (pins or {}).get(reference, reference).removeprefix(f"{repository}:")


def nvidia_device_plugin_values(pins: ChartPins = None) -> dict:
    """MOFED off (it fights the EFA plugin in 0.19.x); tolerate the GPU taint."""
    return {
        "image": {
            "repository": NVIDIA_DEVICE_PLUGIN_IMAGE,
            "tag": pinned_tag(NVIDIA_DEVICE_PLUGIN_IMAGE, NVIDIA_DEVICE_PLUGIN.image_tag, pins),
        },
        "mofedEnabled": False,
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, GPU_TOLERATION],
    }


def eks_registry(region: str) -> str:
    """The region's registry of EKS add-on images, pulled by the nodes over their own region's endpoint."""
    suffix = ".cn" if region.startswith("cn-") else ""
    return f"{EKS_REGISTRY_ACCOUNTS.get(region, EKS_REGISTRY_ACCOUNT)}.dkr.ecr.{region}.amazonaws.com{suffix}"


def efa_device_plugin_image(region: str) -> str:
    """The EFA device plugin's image repository in the region's EKS registry."""
    return f"{eks_registry(region)}/{EFA_DEVICE_PLUGIN_REPOSITORY}"


def efa_device_plugin_values(gpu_instance_type: str, region: str, pins: ChartPins = None) -> dict:
    """Only on GPU nodes, which are tainted: the chart tolerates nothing by default; the image from
    the stack region's EKS registry rather than the chart's us-west-2 default (a cross-region pull).

    The chart's DaemonSet also requires the node's instance type to be in its own list of EFA types
    (`supportedInstanceLabels`); a type missing there would get no plugin pod and no EFA device,
    while the release still reports ready. The list is the configured GPU type (Helm replaces
    lists whole).
    """
    return {
        "image": {
            "repository": efa_device_plugin_image(region),
            "tag": pinned_tag(efa_device_plugin_image(region), EFA_DEVICE_PLUGIN.image_tag, pins),
        },
        "nodeSelector": dict(GPU_NODE_SELECTOR),
        "tolerations": [GPU_TOLERATION],
        "supportedInstanceLabels": {"keys": [INSTANCE_TYPE_LABEL], "values": [gpu_instance_type]},
    }


def kuberay_operator_values(watch_namespace: str, pins: ChartPins = None) -> dict:
    """The operator lives on the system node and reaches the Ray namespace alone.

    The chart's default (`singleNamespaceInstall: false`) binds the operator to a ClusterRole over
    every namespace: Secrets, pods, Roles, RoleBindings and NetworkPolicies anywhere. With
    `singleNamespaceInstall: true` the chart makes no ClusterRole or ClusterRoleBinding
    (templates/role.yaml, rolebinding.yaml and the RayJob/RayService editor and viewer roles are
    skipped) and instead the same rules as a Role and RoleBinding in each namespace of
    `watchNamespace` (templates/multiple_namespaces_role.yaml and multiple_namespaces_rolebinding.yaml,
    with the default `crNamespacedRbacEnable: true`); the operator is started with
    `--watch-namespace <them>` (templates/deployment.yaml), so its caches list and watch there alone
    (ray-operator/main.go, `cache.Options.DefaultNamespaces`). Those rules hold what the RayCluster
    needs of it in its namespace: pods, Services, and the Secret of the Ray token (`secrets`: create,
    get, list, watch, update, delete; ray-operator/controllers/ray/raycluster_controller.go,
    `reconcileAuthSecret`). The operator loses no read it uses: its controllers' RBAC markers name no
    nodes or other cluster-scoped kind but IngressClasses, which 1.7.0 never reads; and its
    leader-election Lease stays in its own namespace, where the chart's leader-election Role is
    (templates/leader_election_role.yaml; main.go leaves `LeaderElectionNamespace` to the pod's
    namespace). KubeRay's "Helm Chart RBAC" guide (ray-project/ray,
    doc/source/cluster/kubernetes/user-guides/helm-chart-rbac.md), case 3.

    `watchNamespace` is read by the chart's templates but appears in its values.yaml only as a
    commented example (a list of names).
    """
    return {
        "image": {
            "repository": KUBERAY_OPERATOR_IMAGE,
            "tag": pinned_tag(KUBERAY_OPERATOR_IMAGE, KUBERAY_OPERATOR.image_tag, pins),
        },
        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
        "singleNamespaceInstall": True,
        "watchNamespace": [watch_namespace],
    }
