"""Run `__main__.py` under Pulumi's own mocks and record every resource it registers.

The fake AWS account (`tests.harness.fake_aws`) answers the invokes; this module adds the resource side:
plausible outputs for what the program reads back (ARNs, ids, the cluster's kubeconfig) and a
record of each registration with its parent and dependencies, so tests can assert the plan. Given
what a deployed stack's state holds for its TrainingRun, it answers as the engine does for a
resource whose Diff finds no change: with the outputs the state holds. From the registrations,
`destroy_outcome` tells what a `pulumi destroy` of the plan deletes, the engine's way.
"""

from __future__ import annotations

import json
import runpy
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.proto import provider_pb2
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from infra.preflight import placement
from platform_contract import is_dev_stack
from tests.harness.fake_aws import FakeAws, FakeAwsMocks
from tests.harness.fake_oci_registry import serving_the_program, the_programs_images
from tests.harness.paths import REPO_ROOT
from workloads import addons
from workloads.training_run.provider import diff_props

ROOT = REPO_ROOT
STACK_FILES = sorted(ROOT.glob("Pulumi.*.yaml"))
DEV_STACK_FILE = ROOT / "Pulumi.dev.yaml"
ACCOUNT = "123456789012"
# What a user adds before the first `pulumi up` (the stack files say so); tests stand in for it.
USER_SETTINGS = {"eks-ray-train:endpointPublicAccessCidrs": '["203.0.113.7/32"]'}
# What a user adds to a stack that is not a dev stack: the image pinned by its digest. The digest is
# the tests' stand-in, as 203.0.113.7 is for an address: the repository records no real one.
PINNED_IMAGE = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "0" * 64


def stack_name(stack_file: Path) -> str:
    """The stack a stack file belongs to (`Pulumi.<stack>.yaml`)."""
    return stack_file.name.removeprefix("Pulumi.").removesuffix(".yaml")


def user_settings(stack_file: Path) -> dict[str, str]:
    """What a user adds to this stack file before its first `pulumi up` (its comments say so)."""
    pinned = {} if is_dev_stack(stack_name(stack_file)) else {"eks-ray-train:image": PINNED_IMAGE}
    return {**USER_SETTINGS, **pinned}


TRAINING_RUN = "pulumi-python:dynamic/workloads:TrainingRun"
ADDON = "aws:eks/addon:Addon"


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    dependencies: list[str]
    inputs: dict[str, Any]
    secret_inputs: set[str]
    alias_names: list[str] = field(default_factory=list)
    alias_parents: list[str] = field(default_factory=list)  # the parent URN each alias names
    delete_before_replace: bool = False
    provider: str = ""  # the explicit provider reference, `<urn>::<id>`
    retain_on_delete: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    deleted_with: str = ""  # the URN of the resource whose delete spares this one's (`deleted_with`)
    custom: bool = True  # False for a component resource, which has nothing in AWS to delete


@dataclass
class Preview:
    """Everything one program run registered, in order, and its stack outputs (`pulumi.export`)."""

    resources: list[Registration] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[Registration]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str, name: str | None = None) -> Registration:
        found = [r for r in self.of_type(type_token) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {type_token} {name or ''}, found {[r.name for r in found]}"
        return found[0]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.resources if r.urn == urn)

    def destroy(self, failing: str | None = None, continue_on_error: bool = False) -> DestroyOutcome:
        """What `pulumi destroy` of the stack this plan deployed does, the delete of `failing` (a URN)
        failing: `destroy_outcome` over the registrations."""
        return destroy_outcome(self.resources, failing, continue_on_error)

    def ancestors(self, registration: Registration) -> list[str]:
        """Types of the components a resource sits under, nearest first."""
        chain, parent = [], registration.parent
        while parent:
            node = next((r for r in self.resources if r.urn == parent), None)
            if node is None:
                break
            chain.append(node.type)
            parent = node.parent
        return chain


@dataclass(frozen=True)
class DestroyOutcome:
    """What a destroy did to each resource, by URN. `deleted`: its provider's Delete ran (gone from
    AWS); `dropped`: it left the state with no Delete (retained, deleted with a resource being
    deleted, a component or a provider); `standing`: never reached (still in the state and in AWS);
    `failed`: its Delete failed (still in both)."""

    deleted: frozenset[str]
    dropped: frozenset[str]
    standing: frozenset[str]
    failed: frozenset[str]


def dependencies_for_deletion(registration: Registration, registered: list[Registration]) -> set[str]:
    """The URNs the engine deletes `registration` before (pulumi/pulumi pkg/resource/graph
    dependency_graph.go, `DependenciesOf`): its parent, dependencies, `deletedWith` and explicit
    provider, and every descendant registered before it of a component among the last three (a
    remote component's dependents name the component, not its children)."""
    urns = [r.urn for r in registered]
    before = set(urns[: urns.index(registration.urn)])
    provider = registration.provider.rsplit("::", 1)[0]  # a provider reference is `<urn>::<id>`
    named = {registration.deleted_with, provider, *registration.dependencies} & before
    found = set(named)
    for dependency in named:
        if not next(r for r in registered if r.urn == dependency).custom:
            found |= {r.urn for r in registered if r.urn in before and _descends(r, dependency, registered)}
    # The parent counts, its other children do not.
    return found | ({registration.parent} & before)


def _descends(registration: Registration, ancestor: str, registered: list[Registration]) -> bool:
    parents = {r.urn: r.parent for r in registered}
    parent = registration.parent
    while parent:
        if parent == ancestor:
            return True
        parent = parents.get(parent, "")
    return False


def destroy_outcome(
    registered: list[Registration], failing: str | None = None, continue_on_error: bool = False
) -> DestroyOutcome:
    """`pulumi destroy` as the engine schedules it (pulumi/pulumi pkg/resource/deploy):

    - `stepGenerator.ScheduleDeletes`: waves, each deleted only after the one before has finished; a
      resource's wave comes before every wave of what it depends on (`dependencies_for_deletion`).
    - `DeleteStep.Apply`: no provider Delete for a resource retained on delete, nor for one whose
      `deletedWith` resource this destroy deletes too (every resource in it, whether or not its
      own delete then succeeds); either way the resource leaves the state.
    - `stepExecutor.cancelDueToError`: a failed delete stops the destroy once its wave has run (its
      steps run in parallel); with `--continue-on-error` the destroy goes on, but never deletes what
      the failed resource depends on (`deploymentExecutor`, `erroredDeps`).
    """
    by_urn = {r.urn: r for r in registered}
    dependencies = {r.urn: dependencies_for_deletion(r, registered) for r in registered}
    condemned, waves = set(by_urn), []
    while condemned:
        wave = {urn for urn in condemned if not dependencies[urn] & condemned}
        condemned -= wave
        waves.append(wave)
    deleted: set[str] = set()
    dropped: set[str] = set()
    failed: set[str] = set()
    held: set[str] = set()  # what a failed resource depends on, transitively
    for wave in reversed(waves):
        for urn in sorted(wave - held):
            registration = by_urn[urn]
            if urn == failing:
                failed.add(urn)
                todo = list(dependencies[urn])
                while todo:
                    if (dependency := todo.pop()) not in held:
                        held.add(dependency)
                        todo += dependencies[dependency]
            elif (
                registration.retain_on_delete
                or registration.deleted_with in by_urn
                or not registration.custom
                or registration.type.startswith("pulumi:providers:")
            ):
                dropped.add(urn)
            else:
                deleted.add(urn)
        if failed and not continue_on_error:
            break
    standing = set(by_urn) - deleted - dropped - failed
    return DestroyOutcome(frozenset(deleted), frozenset(dropped), frozenset(standing), frozenset(failed))


def _eks_cluster_urn(component_name: str) -> str:
    return f"urn:pulumi:{pulumi.get_stack()}::eks-ray-train::aws:eks/cluster:Cluster::{component_name}-eksCluster"


def fake_outputs(args: pulumi.runtime.MockResourceArgs, region: str) -> dict[str, Any]:
    """Outputs the program reads back from resources it creates."""
    name, arn = args.name, f"arn:aws:service:{region}:{ACCOUNT}:{args.typ.split(':')[-1].lower()}/{args.name}"
    outputs: dict[str, Any] = {"arn": arn, "name": args.inputs.get("name", name)}
    if args.typ == "eks:index:Cluster":
        issuer = f"oidc.eks.{region}.amazonaws.com/id/0123456789ABCDEF"
        outputs.update(
            kubeconfigJson='{"apiVersion": "v1", "kind": "Config", "clusters": []}',
            clusterSecurityGroupId="sg-0eksclusterprimary",
            oidcProviderArn=f"arn:aws:iam::{ACCOUNT}:oidc-provider/{issuer}",
            oidcProviderUrl=issuer,
        )
        if not pulumi.runtime.is_dry_run():
            # Its aws.eks.Cluster, which `pulumi up` knows (in a first preview it is unknown).
            outputs["eksCluster"] = {
                pulumi.runtime.rpc._special_sig_key: pulumi.runtime.rpc._special_resource_sig,
                "urn": _eks_cluster_urn(name),
                "id": f"{name}-eksCluster-id",
            }
    elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
        outputs["latestVersion"] = 1
    elif args.typ == "aws:s3/bucket:Bucket":
        outputs["bucket"] = args.inputs.get("bucket", f"{name}-0a1b2c3")
        outputs["arn"] = f"arn:aws:s3:::{outputs['bucket']}"
    elif args.typ == "aws:eks/nodeGroup:NodeGroup":
        outputs["nodeGroupName"] = name
    return outputs


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock monitor, plus each registration's parent, dependencies and secret inputs.

    It also answers method calls on resources (`monitor.Call`, which Pulumi's mock monitor lacks):
    the resource the method is called on arrives as `__self__`, here as its registration.
    """

    def __init__(self, mocks: ProgramMocks) -> None:
        super().__init__(mocks)
        self.plan = Preview()

    def Call(self, request):
        _ensure_event_loop()
        # `__self__` is a resource reference; read its URN rather than rebuild the resource.
        call_args = struct_pb2.Struct()
        call_args.CopyFrom(request.args)
        self_urn = call_args.fields.pop("__self__").struct_value.fields["urn"].string_value
        args = pulumi.runtime.rpc.deserialize_properties(call_args, keep_unknowns=True)
        args["__self__"] = self.plan.by_urn(self_urn)
        result = self.mocks.call(pulumi.runtime.MockCallArgs(request.tok, args, request.provider))
        return provider_pb2.CallResponse(
            **{"return": _sync_await(pulumi.runtime.rpc.serialize_properties(result, {}))}
        )

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type == "eks:index:Cluster" and not pulumi.runtime.is_dry_run():
            # The pulumi-eks component's `eksCluster` output, a reference to its aws.eks.Cluster: the
            # SDK reads a referenced resource with the `pulumi:pulumi:getResource` invoke, which the
            # mock monitor answers from the resources it holds.
            inputs = pulumi.runtime.rpc.deserialize_properties(request.object)
            eks_urn = _eks_cluster_urn(request.name)
            self.resources[eks_urn] = pulumi_mocks.MockMonitor.ResourceRegistration(
                eks_urn,
                f"{request.name}-eksCluster-id",
                {"name": inputs.get("name"), "version": inputs.get("version")},
            )
        if request.type != "pulumi:pulumi:Stack":
            inputs = pulumi.runtime.rpc.deserialize_properties(request.object, keep_unknowns=True)
            self.plan.resources.append(
                Registration(
                    type=request.type,
                    name=request.name,
                    urn=response.urn,
                    parent=request.parent,
                    dependencies=list(request.dependencies),
                    inputs=inputs,
                    secret_inputs=_secret_paths(request.object),
                    alias_names=[a.spec.name for a in request.aliases if a.HasField("spec")],
                    alias_parents=[a.spec.parentUrn for a in request.aliases if a.HasField("spec")],
                    delete_before_replace=request.deleteBeforeReplace,
                    provider=request.provider,
                    retain_on_delete=request.retainOnDelete,
                    ignore_changes=list(request.ignoreChanges),
                    deleted_with=request.deletedWith,
                    custom=request.custom,
                )
            )
        return response


def _secret_paths(struct) -> set[str]:
    """Top-level input names whose value is a Pulumi secret."""
    secret_sig = pulumi.runtime.rpc._special_sig_key
    found = set()
    for key, value in struct.fields.items():
        if value.HasField("struct_value") and secret_sig in value.struct_value.fields:
            sig = value.struct_value.fields[secret_sig].string_value
            if sig == pulumi.runtime.rpc._special_secret_sig:
                found.add(key)
    return found


def eks_kubeconfig(cluster: Registration, region: str, profile: str | None, role_arn: str | None) -> str:
    """What pulumi-eks's `Cluster.getKubeconfig` returns: a kubeconfig whose user runs `aws eks get-token`.

    As pulumi-eks's `generateKubeconfig` (nodejs/eks/cluster/cluster.ts) builds it: `--role` when a
    role is given, `--profile` when a profile is (this method always includes the profile).
    """
    token_args = ["--region", region, "eks", "get-token", "--cluster-name", cluster.inputs["name"]]
    token_args += ["--output", "json"]
    if role_arn:
        token_args += ["--role", role_arn]
    if profile:
        token_args += ["--profile", profile]
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": token_args,
            "env": [
                {
                    "name": "KUBERNETES_EXEC_INFO",
                    "value": '{"apiVersion": "client.authentication.k8s.io/v1beta1"}',
                }
            ],
        }
    }
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"cluster": {"server": "https://example.eks.amazonaws.com"}, "name": "kubernetes"}],
            "contexts": [{"context": {"cluster": "kubernetes", "user": "aws"}, "name": "aws"}],
            "current-context": "aws",
            "users": [{"name": "aws", "user": user}],
        }
    )


class ProgramMocks(FakeAwsMocks):
    """The fake account's invokes and pulumi-eks's method calls, plus outputs for the resources the program
    creates. `recorded`: what the state holds for the TrainingRun (its name -> its outputs), from an
    earlier `pulumi up`. `first_preview`: the engine's answers in the first `pulumi preview` of a new
    stack, where nothing exists yet (`new_resource`, `call`)."""

    def __init__(
        self, aws: FakeAws, recorded: dict[str, dict[str, Any]] | None = None, first_preview: bool = False
    ):
        super().__init__(aws)
        self.recorded = recorded or {}
        self.first_preview = first_preview

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if args.token == "eks:index:Cluster/getKubeconfig":
            if self.first_preview:
                # pulumi-eks builds the kubeconfig from the cluster's outputs (nodejs/eks/cluster.ts,
                # `Cluster.getKubeconfig` -> `generateKubeconfig` over the endpoint and CA data), unknown
                # before the cluster exists; its provider's Call returns such an output as the sentinel
                # `rpc.UNKNOWN`, which the SDK's `call` resolves as an unknown output
                # (pulumi/runtime/invoke.py, `call`: `is_known = not rpc.contains_unknowns(deserialized)`).
                return {"result": pulumi.runtime.rpc.UNKNOWN}
            kubeconfig = eks_kubeconfig(
                args.args["__self__"], self.aws.region, args.args.get("profileName"), args.args.get("roleArn")
            )
            return {"result": kubeconfig}
        return super().call(args)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        if self.first_preview:
            # A create at preview: the engine returns an empty ID and the inputs as the state
            # (pulumi/pulumi sdk/go/common/resource/plugin/provider_plugin.go, `(*provider).Create`: a
            # preview of a provider without preview support returns the inputs; a bridged provider
            # that supports it marks its computed outputs unknown). The SDK resolves the empty ID as
            # unknown (pulumi/runtime/resource.py, `register_resource`: `is_known = bool(resp.id)`) and
            # each output it was not given as unknown in a preview (pulumi/runtime/rpc.py,
            # `resolve_outputs`: `known = not settings.is_dry_run() and ...`).
            return "", dict(args.inputs)
        old = self.recorded.get(args.name) if args.typ == TRAINING_RUN else None
        if old is not None and not diff_props(old, args.inputs).changes:
            # The engine's same step: the provider's Diff found no change, so the resource keeps the ID
            # and outputs its state holds, whatever the new inputs (pulumi/pulumi
            # pkg/resource/deploy/step.go, `SameStep.Apply`: "Retain the ID and outputs").
            return f"{args.name}-id", dict(old)
        return f"{args.name}-id", {**args.inputs, **fake_outputs(args, self.aws.region)}


def deployed(plan: Preview, fake_aws: FakeAws) -> FakeAws:
    """The account after `pulumi up` applied `plan`: its EKS cluster, VPC, subnets, control-plane
    log group and managed add-ons exist as AWS then reports them (mocked ids are `<resource name>-id`)."""
    vpc = plan.one("aws:ec2/vpc:Vpc")
    cluster = plan.one("eks:index:Cluster").inputs
    subnets = {f"{s.name}-id": s.inputs["availabilityZone"] for s in plan.of_type("aws:ec2/subnet:Subnet")}
    log_group = plan.one("aws:cloudwatch/logGroup:LogGroup", f"{cluster['name']}-control-plane")
    fake_aws.vpcs[f"{vpc.name}-id"] = vpc.inputs["cidrBlock"]
    fake_aws.subnets.update(subnets)
    fake_aws.clusters[cluster["name"]] = {
        "version": cluster["version"],
        "vpcId": f"{vpc.name}-id",
        "subnetIds": [*cluster["privateSubnetIds"], *cluster["publicSubnetIds"]],
    }
    fake_aws.log_groups[log_group.inputs["name"]] = dict(log_group.inputs["tags"])
    fake_aws.node_groups[cluster["name"]] = {
        f"{group.name}-{index:07x}": {
            "labels": group.inputs["labels"],
            "subnetIds": group.inputs["subnetIds"],
            "status": "ACTIVE",
            "scalingConfig": dict(group.inputs["scalingConfig"]),
        }
        for index, group in enumerate(plan.of_type("aws:eks/nodeGroup:NodeGroup"))
    }
    # An add-on whose version the plan leaves to pulumi-eks runs the newest build EKS offered then.
    fake_aws.addons[cluster["name"]] = {
        name: version or fake_aws.addon_builds[name][cluster["version"]]
        for name, version in addon_versions(plan).items()
    }
    return fake_aws


def addon_versions(plan: Preview) -> dict[str, str | None]:
    """The managed add-ons `plan` installs, by name, at the versions it gives them: its own
    `aws.eks.Addon`s, pulumi-eks's vpc-cni add-on and the kube-proxy add-on of pulumi-eks's cluster
    (None where a version is left to pulumi-eks's lookup)."""
    versions = {addon.inputs["addonName"]: addon.inputs.get("addonVersion") for addon in plan.of_type(ADDON)}
    for cni in plan.of_type("eks:index:VpcCniAddon"):
        versions["vpc-cni"] = cni.inputs.get("addonVersion")
    kube_proxy = plan.one("eks:index:Cluster").inputs.get("kubeProxyAddonOptions") or {}
    if kube_proxy.get("enabled", True):
        versions["kube-proxy"] = kube_proxy.get("version")
    return versions


def stack_config(stack_file: Path) -> dict[str, str]:
    """A stack file's config as the engine hands it to the program (objects as JSON text)."""
    config = yaml.safe_load(stack_file.read_text())["config"]
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in config.items()}


def config_of(stack_file: Path, **overrides: str) -> dict[str, str]:
    """A stack file's config, what a user adds before the first `pulumi up`, and `overrides`
    (keys of this project, or whole `namespace:key` names)."""
    return {
        **stack_config(stack_file),
        **user_settings(stack_file),
        **{key if ":" in key else f"eks-ray-train:{key}": value for key, value in overrides.items()},
    }


def dev_config(**overrides: str) -> dict[str, str]:
    """`config_of` the dev stack, on which most tests set their values."""
    return config_of(DEV_STACK_FILE, **overrides)


def _schemas_left_out(crds: list[dict]) -> list[dict]:
    """The CRDs with each version's schema replaced by one that keeps every field: the same objects,
    names, annotations and options, without the 4 MB of OpenAPI whose serialization made each
    program run 3 s instead of 0.5 s. Tests of the schemas themselves run with `crd_schemas=True`."""
    for crd in crds:
        for version in crd["spec"]["versions"]:
            version["schema"] = {
                "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            }
    return crds


def run_program(
    config: dict[str, str],
    fake_aws: FakeAws | None = None,
    stack: str = "dev",
    secret_keys: list[str] | None = None,
    crd_schemas: bool = False,
    now: datetime | None = None,
    recorded: dict[str, dict[str, Any]] | None = None,
    preview: bool = True,
    first_preview: bool = False,
) -> Preview:
    """Run `__main__.py` once under mocks with this stack config; raise what the program raises.

    `crd_schemas`: apply KubeRay's CRDs with their full schemas (see `_schemas_left_out`). `now`:
    the time the preview reads (`infra.preflight.placement.utc_now`), for tests about reservation dates.
    `recorded`: what the state of an earlier `pulumi up` holds for the TrainingRun (`ProgramMocks`).
    `preview=False`: the program as `pulumi up` runs it after its preview, where an output the engine
    did not return resolves to None; in a preview it is unknown (pulumi/runtime/rpc.py, `resolve_properties`).
    The pulumi-eks cluster's `eksCluster` then resolves too (`RecordingMonitor.RegisterResource`).
    `first_preview=True`: the first `pulumi preview` of a new stack, where every output the program
    reads back from a resource is unknown (`ProgramMocks`); `preview=True` alone answers with the ids
    and outputs of `fake_outputs`, known.
    """
    assert preview or not first_preview, "a first preview is a preview"
    if now is not None:
        machine_time = placement.utc_now
        placement.utc_now = lambda: now
        try:
            return run_program(
                config, fake_aws, stack, secret_keys, crd_schemas, None, recorded, preview, first_preview
            )
        finally:
            placement.utc_now = machine_time
    if not crd_schemas:
        vendored = addons.kuberay_crds
        addons.kuberay_crds = lambda: _schemas_left_out(vendored())
        try:
            return run_program(
                config, fake_aws, stack, secret_keys, True, None, recorded, preview, first_preview
            )
        finally:
            addons.kuberay_crds = vendored
    region = config.get("aws:region", "us-east-2")
    fake_aws = fake_aws or FakeAws(region=region)
    mocks = ProgramMocks(fake_aws, recorded, first_preview)
    monitor = RecordingMonitor(mocks)
    # A root stack of its own for each run (`set_mocks` keeps the last one), so `outputs` holds this
    # run's exports alone.
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project="eks-ray-train", stack=stack, preview=preview, monitor=monitor)
    pulumi.runtime.set_all_config(config, secret_keys or [])
    failure: list[BaseException] = []

    @pulumi.runtime.test
    def program():
        try:
            # The images' registries, which a stack that is not dev reads digests from at preview.
            with serving_the_program(*the_programs_images(region)):
                runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
        except BaseException as err:  # surfaced below, outside Pulumi's event loop
            failure.append(err)

    program()
    # The root stack the mocks made for this run holds what the program exported.
    monitor.plan.outputs = dict(pulumi.runtime.get_root_resource().outputs)
    if failure:
        failure[0].plan = monitor.plan  # what was registered before the failure, for assertions
        raise failure[0]
    return monitor.plan
