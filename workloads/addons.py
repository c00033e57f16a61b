"""Cluster add-ons: GPU and EFA device plugins and the KubeRay operator as pinned Helm releases, KubeRay's
CRDs and the operator's namespace, and the EFA counter reader on the GPU nodes."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from workloads.efa_counter_reader import reader_daemonset, reader_namespace
from workloads.manifests import (
    EFA_DEVICE_PLUGIN,
    KUBERAY_OPERATOR,
    NVIDIA_DEVICE_PLUGIN,
    Chart,
    efa_device_plugin_values,
    kuberay_crds,
    kuberay_namespace,
    kuberay_operator_values,
    nvidia_device_plugin_values,
)
from workloads.manifests.charts import ChartPins


def _release(
    chart: Chart, values: dict, opts: pulumi.ResourceOptions, skip_crds: bool = False
) -> k8s.helm.v3.Release:
    return k8s.helm.v3.Release(
        chart.name,
        name=chart.name,
        chart=chart.name,
        version=chart.version,
        repository_opts={"repo": chart.repository},
        namespace=chart.namespace,
        # Helm would create the namespace without Pod Security labels: every namespace a release
        # installs into is EKS's `kube-system` or declared by the program, before the release.
        create_namespace=False,
        values=values,
        skip_crds=skip_crds,
        # Wait until the release's pods run, so resources are allocatable before Ray pods ask for them.
        skip_await=False,
        atomic=True,
        opts=opts,
    )


class Addons(pulumi.ComponentResource):
    """Device plugins make `nvidia.com/gpu` and `vpc.amazonaws.com/efa` allocatable; KubeRay runs RayClusters.

    KubeRay's CRDs are the program's, not Helm's: Helm installs a chart's `crds/` once and never
    upgrades them, so a chart bump would run a new operator on old CRDs that prune new fields. They
    are applied through `crd_provider`, a provider with server-side apply (the RayCluster CRD is
    larger than the 256 KiB a client-side apply's annotation may hold) and `upsertExistingObjects`
    (on stacks deployed before, Helm created them: the apply patches the object in place, so no
    RayCluster is deleted). Retained on delete: deleting a CRD deletes every object of its kind, and
    `pulumi destroy` deletes the whole cluster anyway.

    The operator is namespace-scoped (`kuberay_operator_values`): its chart puts its Role in
    `ray_namespace`, so the release waits for that namespace (`ray_namespace_object`) as for its own,
    which the program declares with Pod Security `restricted` (`kuberay_namespace`).
    """

    def __init__(
        self,
        name: str,
        *,
        provider: k8s.Provider,
        crd_provider: k8s.Provider,
        gpu_instance_type: str,
        region: str,
        image: str,
        ray_namespace: str,
        ray_namespace_object: pulumi.Resource,
        after: list[pulumi.Resource],
        chart_pins: ChartPins = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`chart_pins`: the chart images as the preview pinned them (`charts.ChartPins`)."""
        super().__init__("eks-ray-train:workloads:Addons", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after)
        operator_namespace = kuberay_namespace()
        self.kuberay_namespace = k8s.core.v1.Namespace(
            operator_namespace["metadata"]["name"],
            metadata=operator_namespace["metadata"],
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        self.kuberay_crds = [
            k8s.apiextensions.v1.CustomResourceDefinition(
                crd["metadata"]["name"],
                metadata=crd["metadata"],
                spec=crd["spec"],
                opts=pulumi.ResourceOptions(parent=self, provider=crd_provider, retain_on_delete=True),
            )
            for crd in kuberay_crds()
        ]
        self.nvidia_device_plugin = _release(
            NVIDIA_DEVICE_PLUGIN, nvidia_device_plugin_values(chart_pins), child
        )
        self.efa_device_plugin = _release(
            EFA_DEVICE_PLUGIN, efa_device_plugin_values(gpu_instance_type, region, chart_pins), child
        )
        # After its CRDs (the operator exits when a kind it watches is not served) and the namespaces
        # it installs into: its own, and the Ray namespace of its Role.
        self.kuberay_operator = _release(
            KUBERAY_OPERATOR,
            kuberay_operator_values(ray_namespace, chart_pins),
            pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                depends_on=[*after, *self.kuberay_crds, self.kuberay_namespace, ray_namespace_object],
            ),
            skip_crds=True,
        )
        self.releases = [self.nvidia_device_plugin, self.efa_device_plugin, self.kuberay_operator]
        # The GPU nodes' EFA counters, read in the host's network namespace (`workloads.efa_counter_reader`).
        namespace = reader_namespace()
        self.counter_reader_namespace = k8s.core.v1.Namespace(
            namespace["metadata"]["name"], metadata=namespace["metadata"], opts=child
        )
        daemonset = reader_daemonset(image)
        self.counter_reader = k8s.apps.v1.DaemonSet(
            daemonset["metadata"]["name"],
            metadata=daemonset["metadata"],
            spec=daemonset["spec"],
            opts=pulumi.ResourceOptions(
                parent=self, provider=provider, depends_on=[*after, self.counter_reader_namespace]
            ),
        )
        # What a RayCluster waits for.
        self.ready: list[pulumi.Resource] = [*self.releases, *self.kuberay_crds]
        self.register_outputs(
            {
                "releases": [release.name for release in self.releases],
                "counterReader": self.counter_reader.metadata["name"],
            }
        )
