"""The Ray side of the cluster: namespace, service account, shipped code, network policies, the head's
disruption budget, the RayCluster CR."""

from __future__ import annotations

import re

import pulumi
import pulumi_kubernetes as k8s

from workloads import manifests


class RayCluster(pulumi.ComponentResource):
    """The namespace and what the pods need in it first; the RayCluster itself (`create_cluster`) only
    after the operator, its CRDs and both device plugins exist. The operator's release waits for the
    namespace (`namespace_object`), where its chart puts the operator's Role.

    `gpu_subnet_cidr`: the GPU nodes' subnet, where the Ray pods reach their node's EFA counter reader.
    """

    def __init__(
        self,
        name: str,
        *,
        spec: manifests.RayClusterSpec,
        gpu_subnet_cidr: str,
        pod_role_arn: pulumi.Input[str],
        hf_token: pulumi.Output[str] | None,
        provider: k8s.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:workloads:RayCluster", name, None, opts)
        self._provider = provider
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        namespace = k8s.core.v1.Namespace(
            spec.namespace, **_body(manifests.namespace(spec.namespace)), opts=child
        )
        self.namespace_object = namespace
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace])
        service_account = k8s.core.v1.ServiceAccount(
            spec.service_account,
            **_body(manifests.service_account(spec.service_account, spec.namespace, pod_role_arn)),
            opts=in_namespace,
        )
        secrets = []
        if hf_token is not None:
            secrets.append(
                k8s.core.v1.Secret(
                    manifests.HF_TOKEN_SECRET,
                    **_body(
                        manifests.hf_token_secret(
                            spec.namespace, pulumi.Output.secret(_secret_input(hf_token))
                        )
                    ),
                    opts=in_namespace,
                )
            )
        self.code_hash = manifests.code_hash(spec.code_files)
        code = k8s.core.v1.ConfigMap(
            spec.code_configmap,
            **_body(manifests.training_code_configmap(spec.code_configmap, spec.namespace, spec.code_files)),
            opts=in_namespace,
        )
        # The Ray pods' policy first, then the namespace's default deny, both before the RayCluster:
        # no Ray pod runs open to other namespaces, and on a stack whose pods already run, none is
        # ever held to the default deny without its own rules (UPGRADING.md, issue 53).
        ray_pods = manifests.ray_pods_network_policy(spec.name, spec.namespace, gpu_subnet_cidr)
        pods_policy = k8s.networking.v1.NetworkPolicy(
            ray_pods["metadata"]["name"], **_body(ray_pods), opts=in_namespace
        )
        default_deny = k8s.networking.v1.NetworkPolicy(
            f"{spec.namespace}-default-deny",
            **_body(manifests.namespace_default_deny(spec.namespace)),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace, pods_policy]),
        )
        # The head's disruption budget before its pod exists: no drain evicts it mid-job.
        budget = manifests.head_disruption_budget(spec.name, spec.namespace)
        head_budget = k8s.policy.v1.PodDisruptionBudget(
            budget["metadata"]["name"], **_body(budget), opts=in_namespace
        )
        self._prepared: list[pulumi.Resource] = [
            namespace,
            service_account,
            code,
            pods_policy,
            default_deny,
            head_budget,
            *secrets,
        ]
        self._manifest = manifests.ray_cluster(spec)
        self.spec_hash = manifests.spec_hash(self._manifest)
        self.name = spec.name
        self.namespace = spec.namespace
        self.register_outputs({"name": spec.name, "namespace": spec.namespace, "codeHash": self.code_hash})

    def create_cluster(self, after: list[pulumi.Resource]) -> k8s.apiextensions.CustomResource:
        """The RayCluster, after everything of its namespace and `after` (the operator, its CRDs, the
        device plugins)."""
        ray_cluster = self._manifest
        return k8s.apiextensions.CustomResource(
            self.name,
            api_version=ray_cluster["apiVersion"],
            kind=ray_cluster["kind"],
            metadata=ray_cluster["metadata"],
            spec=ray_cluster["spec"],
            opts=pulumi.ResourceOptions(
                parent=self, provider=self._provider, depends_on=[*self._prepared, *after]
            ),
        )


def _secret_input(value: pulumi.Output[str]) -> pulumi.Input[str]:
    """Widened for mypy, which cannot solve `Output.secret`'s type variable from an `Output[str]`."""
    return value


def _body(manifest: dict) -> dict:
    """Keyword arguments of a typed k8s resource from a plain manifest (apiVersion and kind dropped).

    Top-level fields become Python's snake_case argument names (`stringData` -> `string_data`);
    nested values are passed through as the manifest spells them.
    """
    return {
        re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value
        for key, value in manifest.items()
        if key not in ("apiVersion", "kind")
    }
