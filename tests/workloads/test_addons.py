"""The add-ons in the program's plan: pinned Helm releases into declared namespaces, the KubeRay
operator confined to the Ray namespace, the EFA counter reader, KubeRay's CRDs applied and upgraded
by the program, the EFA plugin following the GPU type."""

from __future__ import annotations

from tests.harness.fake_aws import (
    FakeAws,
)
from tests.harness.preview_queries import (
    OBJECT_IDENTITY,
    RAY_CLUSTER,
    engine_step,
)
from tests.harness.program import (
    Preview,
    Registration,
    dev_config,
    run_program,
)
from workloads import manifests

RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"


def test_helm_releases_are_pinned(stack_plan):
    _, plan = stack_plan
    releases = {r.inputs["chart"]: r.inputs for r in plan.of_type("kubernetes:helm.sh/v3:Release")}
    assert {chart: values["version"] for chart, values in releases.items()} == {
        "nvidia-device-plugin": "0.20.0",
        "aws-efa-k8s-device-plugin": "v0.5.30",
        "kuberay-operator": "1.7.0",
    }
    assert releases["nvidia-device-plugin"]["values"]["mofedEnabled"] is False


def test_no_release_creates_a_namespace_and_each_installs_into_a_declared_one(stack_plan):
    """Helm's `createNamespace` makes a namespace without Pod Security labels: each release installs into
    EKS's kube-system or a Namespace of the program's, which it waits for."""
    _, plan = stack_plan
    namespaces = {ns.inputs["metadata"]["name"]: ns for ns in plan.of_type(NAMESPACE)}
    for release in plan.of_type(RELEASE):
        assert release.inputs["createNamespace"] is False, release.name
        target = release.inputs["namespace"]
        if target != manifests.KUBE_SYSTEM:
            assert namespaces[target].urn in release.dependencies, release.name
    assert manifests.KUBE_SYSTEM not in namespaces  # EKS's own: never declared, never relabelled
    kuberay = namespaces[manifests.KUBERAY_OPERATOR.namespace]
    assert plan.ancestors(kuberay)[0] == "eks-ray-train:workloads:Addons"
    assert kuberay.inputs["metadata"]["labels"] == {
        "app.kubernetes.io/part-of": "eks-ray-train",
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/audit": "restricted",
    }


def test_the_kuberay_operator_watches_the_ray_namespace_alone(stack_plan):
    """Namespace-scoped: the chart binds the operator to a Role in the Ray namespace, which must exist
    before the release installs that Role there, instead of a ClusterRole over every namespace."""
    config, plan = stack_plan
    namespace = config.get("eks-ray-train:namespace", "ray-train")
    operator = plan.one(RELEASE, manifests.KUBERAY_OPERATOR.name)
    assert operator.inputs["namespace"] == "kuberay"
    assert operator.inputs["createNamespace"] is False
    assert operator.inputs["values"]["singleNamespaceInstall"] is True
    assert operator.inputs["values"]["watchNamespace"] == [namespace]
    ray_namespace = plan.one(NAMESPACE, namespace)
    assert plan.ancestors(ray_namespace)[0] == "eks-ray-train:workloads:RayCluster"
    assert ray_namespace.urn in operator.dependencies
    # The RayCluster still comes after the operator, in the namespace the operator watches.
    ray_cluster = plan.one(RAY_CLUSTER)
    assert operator.urn in ray_cluster.dependencies
    assert ray_cluster.inputs["metadata"]["namespace"] == namespace


def test_the_efa_counter_reader_runs_on_the_gpu_nodes_in_its_own_namespace(stack_plan):
    """The only pods that see the nodes' EFA counters (`hostNetwork`), in a namespace that admits them
    (the Ray namespace's `baseline` does not), from the Ray image, beside the device plugins."""
    _, plan = stack_plan
    daemonset = plan.one("kubernetes:apps/v1:DaemonSet", "efa-counters")
    assert plan.ancestors(daemonset)[0] == "eks-ray-train:workloads:Addons"
    assert daemonset.inputs["metadata"]["namespace"] == "efa-counters"
    pod = daemonset.inputs["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["nodeSelector"] == {"role": "gpu-worker"}
    assert (
        pod["containers"][0]["image"]
        == plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["workerGroupSpecs"][0]["template"][
            "spec"
        ]["containers"][0]["image"]
    )
    namespace = plan.one("kubernetes:core/v1:Namespace", "efa-counters")
    assert namespace.urn in daemonset.dependencies
    assert namespace.inputs["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


# pulumi-kubernetes `helm_release.go` Diff: `forceNewFields` ".name", ".namespace".
RELEASE_IDENTITY = ("name", "namespace")


def test_kuberay_crds_are_the_programs_applied_server_side_and_adopted_in_place(stack_plan):
    """On stacks deployed before, Helm created the CRDs: the program's first `up` must patch them, not
    fail on "already exists" (pulumi-kubernetes, pinned 4.34.2, creates with a client-side create unless the
    provider sets `upsertExistingObjects`) and never delete them (that deletes every RayCluster)."""
    _, plan = stack_plan
    crds = plan.of_type(CRD)
    assert sorted(crd.name for crd in crds) == [
        "rayclusters.ray.io",
        "raycronjobs.ray.io",
        "rayjobs.ray.io",
        "rayservices.ray.io",
    ]
    for crd in crds:
        assert crd.inputs["metadata"]["name"] == crd.name
        assert crd.inputs["metadata"]["annotations"]["pulumi.com/patchForce"] == "true"
        assert crd.retain_on_delete is True
        owner = plan.by_urn(crd.provider.rsplit("::", 1)[0])
        assert owner.name == "eks-crds"
        # Provider settings reach the engine as JSON text.
        assert owner.inputs["enableServerSideApply"] == "true"
        assert owner.inputs["upsertExistingObjects"] == "true"
    # The operator's release leaves the CRDs alone and starts after them; the RayCluster after both.
    operator = next(r for r in plan.of_type(RELEASE) if r.inputs["chart"] == "kuberay-operator")
    assert operator.inputs["skipCrds"] is True
    crd_urns = {crd.urn for crd in crds}
    assert crd_urns <= set(operator.dependencies)
    assert crd_urns <= set(plan.one(RAY_CLUSTER).dependencies)
    others = [r for r in plan.of_type(RELEASE) if r is not operator]
    assert all(not r.inputs.get("skipCrds") for r in others)
    # Every other Kubernetes object keeps the stack's first provider: nothing else is adopted silently.
    eks = plan.one("pulumi:providers:kubernetes", "eks")
    assert "upsertExistingObjects" not in eks.inputs
    kubernetes_objects = [r for r in plan.resources if r.type.startswith("kubernetes:") and r.type != CRD]
    assert kubernetes_objects and all(r.provider.rsplit("::", 1)[0] == eks.urn for r in kubernetes_objects)


def test_a_kuberay_chart_bump_upgrades_its_crds_in_place_before_the_operator(tmp_path, monkeypatch):
    """Helm never upgrades `crds/`: the program must, or the new operator's new fields are pruned."""
    from workloads.manifests import crd

    first = run_program(dev_config(), FakeAws(region="us-east-2"), crd_schemas=True)
    # The next chart version's CRDs: here the pinned ones with one more RayCluster field.
    bumped = tmp_path / "kuberay-v1.8.0"
    bumped.mkdir()
    for name in crd.KUBERAY_CRD_FILES:
        (bumped / name).write_text((crd.KUBERAY_CRD_DIR / name).read_text())
    rayclusters = bumped / "ray.io_rayclusters.yaml"
    text = rayclusters.read_text()
    anchor = "              upgradeStrategy:\n"
    assert text.count(anchor) == 1
    rayclusters.write_text(
        text.replace(anchor, "              newField:\n                type: string\n" + anchor)
    )
    monkeypatch.setattr(crd, "KUBERAY_CRD_DIR", bumped)
    second = run_program(dev_config(), FakeAws(region="us-east-2"), crd_schemas=True)

    steps = {
        crd.name: engine_step(first.one(CRD, crd.name), crd, OBJECT_IDENTITY) for crd in second.of_type(CRD)
    }
    assert steps == {
        "rayclusters.ray.io": "update",
        "raycronjobs.ray.io": "same",
        "rayjobs.ray.io": "same",
        "rayservices.ray.io": "same",
    }
    new_schema = second.one(CRD, "rayclusters.ray.io").inputs["spec"]["versions"][0]["schema"]
    spec_fields = new_schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec_fields["newField"] == {"type": "string"}
    operator = next(r for r in second.of_type(RELEASE) if r.inputs["chart"] == "kuberay-operator")
    assert second.one(CRD, "rayclusters.ray.io").urn in operator.dependencies


def test_another_gpu_type_moves_the_efa_plugin_with_it():
    """The EFA chart's DaemonSet schedules only on `supportedInstanceLabels.values`: the release
    follows `gpuNodeType` and is upgraded in place."""
    first = run_program(dev_config(), FakeAws(region="us-east-2"))
    second = run_program(dev_config(gpuNodeType="g5.12xlarge"), FakeAws(region="us-east-2"))

    def efa(plan: Preview) -> Registration:
        return next(r for r in plan.of_type(RELEASE) if r.inputs["chart"] == "aws-efa-k8s-device-plugin")

    assert efa(first).inputs["values"]["supportedInstanceLabels"] == {
        "keys": ["node.kubernetes.io/instance-type"],
        "values": ["g6.12xlarge"],
    }
    assert efa(second).inputs["values"]["supportedInstanceLabels"]["values"] == ["g5.12xlarge"]
    assert engine_step(efa(first), efa(second), RELEASE_IDENTITY) == "update"
