"""Cluster add-ons as pinned Helm releases: GPU and EFA device plugins, the KubeRay operator."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from workloads.manifests import (
    EFA_DEVICE_PLUGIN,
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    Chart,
    efa_device_plugin_values,
    kuberay_operator_values,
    nvidia_device_plugin_values,
)


def _release(chart: Chart, values: dict, opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    return k8s.helm.v3.Release(
        chart.name,
        name=chart.name,
        chart=chart.name,
        version=chart.version,
        repository_opts={"repo": chart.repository},
        namespace=chart.namespace,
        create_namespace=chart.namespace != "kube-system",
        values=values,
        # Wait until the release's pods run, so resources are allocatable before Ray pods ask for them.
        skip_await=False,
        atomic=True,
        opts=opts,
    )


class Addons(pulumi.ComponentResource):
    """Device plugins make `nvidia.com/gpu` and `vpc.amazonaws.com/efa` allocatable; KubeRay runs RayClusters."""

    def __init__(
        self,
        name: str,
        *,
        provider: k8s.Provider,
        after: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:workloads:Addons", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after)
        self.nvidia_device_plugin = _release(NVIDIA_DEVICE_PLUGIN, nvidia_device_plugin_values(), child)
        self.efa_device_plugin = _release(EFA_DEVICE_PLUGIN, efa_device_plugin_values(), child)
        self.kuberay_operator = _release(KUBERAY_OPERATOR, kuberay_operator_values(), child)
        self.releases = [self.nvidia_device_plugin, self.efa_device_plugin, self.kuberay_operator]
        self.register_outputs({"releases": [release.name for release in self.releases]})
