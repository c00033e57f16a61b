"""A later `pulumi up`: the program runs twice under mocks, the first deploy, then the world after it.

`tests.harness.program.deployed` turns the first run's plan into what AWS then reports (the EKS cluster,
its VPC, subnets, node groups and log group); `deployed` here adds the cluster's CoreDNS add-on. The
second run sees that account, with changed settings or changed offerings, and must plan what AWS
accepts or refuse at preview naming the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pulumi
import pytest
from pulumi.output import Unknown
from pulumi.runtime import rpc

from infra.aws_rules.container_insights import ADDON_NAME as OBSERVABILITY_ADDON
from infra.aws_rules.live_stack import OWNER_TAG
from infra.aws_rules.node_repair import ADDON_NAME as NODE_MONITORING_ADDON
from infra.config.stack import DEFAULT_IMAGE
from infra.preflight import live_cluster
from tests.harness.fake_aws import (
    COREDNS_VERSIONS,
    NODE_MONITORING_VERSIONS,
    OBSERVABILITY_VERSIONS,
    AwsApiError,
    FakeAws,
)
from tests.harness.fake_oci_registry import (
    FakeRegistries,
    index_manifest,
    serving_the_program,
    the_programs_images,
)
from tests.harness.program import ROOT, Preview, config_of, dev_config, run_program
from tests.harness.program import deployed as deployed_stack
from workloads.training_run.provider import diff_props

SUBNET = "aws:ec2/subnet:Subnet"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"
GET_ADDON = "aws:eks/getAddon:getAddon"
CLUSTER_NAME = "eks-ray-train"
# A CoreDNS build for 1.34 that EKS publishes after the first deploy (newer than COREDNS_VERSIONS's).
LATER_COREDNS_BUILD = "v1.12.4-eksbuild.4"
# A CloudWatch Observability build EKS publishes after the first deploy.
LATER_OBSERVABILITY_BUILD = "v6.5.0-eksbuild.1"
# A node monitoring agent build EKS publishes after the first deploy.
LATER_NODE_MONITORING_BUILD = "v1.8.0-eksbuild.1"


@dataclass
class FakeAccount(FakeAws):
    """`FakeAws`, plus the managed add-ons of its EKS clusters and the builds EKS offers now.

    `addons`: cluster name -> add-on name -> version. `coredns_versions`, `observability_versions`:
    Kubernetes version -> the newest build of CoreDNS or of the CloudWatch Observability add-on for
    it, COREDNS_VERSIONS and OBSERVABILITY_VERSIONS until a test publishes a later one.
    """

    addons: dict[str, dict[str, str]] = field(default_factory=dict)
    coredns_versions: dict[str, str] = field(default_factory=lambda: dict(COREDNS_VERSIONS))
    observability_versions: dict[str, str] = field(default_factory=lambda: dict(OBSERVABILITY_VERSIONS))
    node_monitoring_versions: dict[str, str] = field(default_factory=lambda: dict(NODE_MONITORING_VERSIONS))

    def call(self, token: str, args: dict) -> dict:
        if token != GET_ADDON:
            return super().call(token, args)
        self.calls.append((token, dict(args)))
        if token in self.denied:
            raise AwsApiError(
                token, "AccessDeniedException", f"user/tester is not authorized to perform {token}"
            )
        return self._addon(args)

    def _addon(self, args: dict) -> dict:
        # EKS API reference, DescribeAddon (https://docs.aws.amazon.com/eks/latest/APIReference/API_DescribeAddon.html):
        # the add-on with its `addonVersion`, or ResourceNotFoundException when the cluster has no
        # such add-on, which the provider's `aws_eks_addon` data source reports as "couldn't find
        # resource" (terraform-provider-aws internal/service/eks/addon.go, findAddonByTwoPartKey).
        cluster, name = args["clusterName"], args["addonName"]
        if name not in self.addons.get(cluster, {}):
            raise self._missing("EKS Add-On", f"{cluster},{name}")
        return {
            "id": f"{cluster}:{name}",
            "clusterName": cluster,
            "addonName": name,
            "addonVersion": self.addons[cluster][name],
            "region": self.region,
        }

    def _addon_version(self, args: dict) -> dict:
        # EKS API reference, DescribeAddonVersions
        # (https://docs.aws.amazon.com/eks/latest/APIReference/API_DescribeAddonVersions.html): an
        # add-on's versions with the Kubernetes versions each is compatible with; EKS adds builds
        # over time, and the provider's `most_recent = true` returns the newest for the version asked.
        builds = {
            "coredns": self.coredns_versions,
            OBSERVABILITY_ADDON: self.observability_versions,
            NODE_MONITORING_ADDON: self.node_monitoring_versions,
        }
        version = builds.get(args["addonName"], {}).get(args["kubernetesVersion"])
        if version is None:
            return super()._addon_version(args)
        return {**args, "id": args["addonName"], "version": version, "region": self.region}


def deployed(plan: Preview, fake: FakeAccount) -> FakeAccount:
    """`tests.harness.program.deployed`, plus the managed add-ons at the versions `plan` gave them."""
    deployed_stack(plan, fake)
    cluster = plan.one("eks:index:Cluster").inputs["name"]
    fake.addons[cluster] = {addon.name: addon.inputs["addonVersion"] for addon in plan.of_type(ADDON)}
    return fake


def coredns_version(plan: Preview) -> str:
    return plan.one(ADDON, "coredns").inputs["addonVersion"]


def after_first_deploy(fake: FakeAccount, **overrides: str) -> FakeAccount:
    return deployed(run_program(dev_config(**overrides), fake), fake)


def refusal(fake: FakeAccount, **overrides: str) -> str:
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(**overrides), fake)
    assert raised.value.plan.resources == []
    return str(raised.value)


def test_an_unchanged_second_run_plans_the_same_resources():
    fake = FakeAccount(region="us-east-2")
    first = run_program(dev_config(), fake)
    second = run_program(dev_config(), deployed(first, fake))
    assert sorted((r.type, r.name) for r in second.resources) == sorted(
        (r.type, r.name) for r in first.resources
    )
    # The same resources means the same declarations, not only the same names: what each is given
    # (its inputs, secret ones among them), where it sits, what it waits for and how it is replaced,
    # so a run that keeps the names but changes what they declare does not pass.
    assert planned(second) == planned(first)


def planned(preview: Preview) -> dict[tuple[str, str], tuple]:
    """Each resource's declaration as the engine would diff it, by (type, name)."""
    return {
        (r.type, r.name): (
            comparable(r.inputs),
            sorted(r.secret_inputs),
            r.parent,
            sorted(r.dependencies),
            r.provider,
            r.delete_before_replace,
            r.retain_on_delete,
            sorted(r.ignore_changes),
        )
        for r in preview.resources
    }


def comparable(value: Any) -> Any:
    """`value` with each value not known at preview as one marker (each run makes its own `Unknown`
    objects, which compare by identity)."""
    if isinstance(value, Unknown):
        return "<unknown at preview>"
    if isinstance(value, dict):
        return {key: comparable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(item) for item in value]
    return value


def test_eks_keeps_a_clusters_vpc_for_life():
    fake = after_first_deploy(FakeAccount(region="us-east-2"))
    message = refusal(fake, vpcCidr="10.1.0.0/16")
    assert message.startswith(
        "config key 'vpcCidr' = '10.1.0.0/16': the cluster runs in a VPC of 10.0.0.0/16"
    )
    assert "`pulumi destroy` first" in message


@pytest.mark.parametrize(
    ("wanted", "problem"),
    [
        ("1.36", "EKS upgrades one minor version at a time: set 1.35, run `pulumi up`, then go on"),
        ("1.33", "EKS never downgrades a control plane: set 1.34 back"),
    ],
)
def test_eks_upgrades_a_control_plane_one_minor_version_at_a_time(wanted, problem):
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    assert refusal(fake, kubernetesVersion=wanted) == (
        f"config key 'kubernetesVersion' = '{wanted}': the cluster runs 1.34, and {problem}"
    )
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), fake)
    assert upgraded.one("eks:index:Cluster").inputs["version"] == "1.35"


def test_a_live_cluster_keeps_its_zones_when_aws_adds_an_offering():
    """EKS accepts new subnets only in the zones a cluster was created with; zones chosen anew from
    today's offerings would move the cluster's subnets, and the GPU nodes with them."""
    region = "us-east-1"
    before = {
        "m7i.xlarge": ["us-east-1b", "us-east-1c", "us-east-1d"],
        "g6.12xlarge": ["us-east-1c", "us-east-1d"],
    }
    fake = FakeAccount(region=region, offerings=before)
    first = run_program(dev_config(**{"aws:region": region}), fake)
    deployed(first, fake)
    fake.offerings = {name: ["us-east-1a", *zones] for name, zones in before.items()}
    second = run_program(dev_config(**{"aws:region": region}), fake)
    for plan in (first, second):
        zones = {r.inputs["availabilityZone"] for r in plan.of_type(SUBNET) if "-public-" in r.name}
        assert zones == {"us-east-1b", "us-east-1c", "us-east-1d"}
        gpu_subnet = plan.one(NODE_GROUP, "gpu").inputs["subnetIds"][0]
        assert gpu_subnet.endswith("-private-us-east-1c-id")
    fresh = run_program(
        dev_config(**{"aws:region": region}), FakeAccount(region=region, offerings=fake.offerings)
    )
    assert fresh.one(NODE_GROUP, "gpu").inputs["subnetIds"][0].endswith("-private-us-east-1a-id")


def test_moving_the_gpu_zone_of_a_live_cluster_is_still_a_setting():
    fake = after_first_deploy(FakeAccount(region="us-east-2"))
    moved = run_program(dev_config(gpuAz="us-east-2b"), fake)
    assert moved.one(NODE_GROUP, "gpu").inputs["subnetIds"][0].endswith("-private-us-east-2b-id")


def test_a_log_group_left_by_a_destroyed_cluster_is_named_at_preview():
    """EKS writes its last logs after the program deleted the group, re-creating it without the
    program's tag (terraform-aws-eks#2763); CreateLogGroup would then fail after the VPC exists."""
    fake = FakeAccount(region="us-east-2", log_groups={"/aws/eks/eks-ray-train/cluster": {}})
    message = refusal(fake)
    assert message.startswith("config key 'clusterName' = 'eks-ray-train': no cluster of that name runs")
    assert (
        "aws logs delete-log-group --log-group-name /aws/eks/eks-ray-train/cluster --region us-east-2"
        in message
    )


def test_the_stacks_own_log_group_without_a_cluster_is_no_orphan():
    """A first `pulumi up` that failed after the log group and before the cluster: the group is the stack's."""
    fake = FakeAccount(
        region="us-east-2", log_groups={"/aws/eks/eks-ray-train/cluster": {OWNER_TAG: "eks-ray-train/dev"}}
    )
    assert run_program(dev_config(), fake).of_type("eks:index:Cluster")


def test_a_first_preview_takes_the_newest_coredns_for_the_kubernetes_version():
    fake = FakeAccount(region="us-east-2")
    plan = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert coredns_version(plan) == COREDNS_VERSIONS["1.34"]
    assert GET_ADDON not in [token for token, _ in fake.calls]  # no cluster, no add-on to read


def test_coredns_stays_at_the_live_version_when_eks_publishes_a_newer_build():
    """An unrelated `pulumi up` must not update CoreDNS (with OVERWRITE) because EKS published a build."""
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    assert fake.addons[CLUSTER_NAME]["coredns"] == COREDNS_VERSIONS["1.34"]
    fake.coredns_versions["1.34"] = LATER_COREDNS_BUILD
    second = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert coredns_version(second) == COREDNS_VERSIONS["1.34"]
    assert (GET_ADDON, {"addonName": "coredns", "clusterName": CLUSTER_NAME}) in [
        (token, {key: value for key, value in args.items() if value is not None})
        for token, args in fake.calls
    ]
    # A new stack takes the build EKS offers now.
    fresh = run_program(
        dev_config(kubernetesVersion="1.34"),
        FakeAccount(region="us-east-2", coredns_versions=fake.coredns_versions),
    )
    assert coredns_version(fresh) == LATER_COREDNS_BUILD


def test_a_kubernetes_version_change_takes_the_newest_coredns_for_the_new_version():
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    fake.coredns_versions["1.34"] = LATER_COREDNS_BUILD
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), fake)
    assert coredns_version(upgraded) == COREDNS_VERSIONS["1.35"]


@pytest.mark.parametrize("why", ["no add-on", "DescribeAddon denied"])
def test_a_live_cluster_whose_coredns_is_not_read_takes_the_newest(why):
    """A cluster without the add-on (a first `pulumi up` that stopped before the system nodes it
    waits for), or one whose add-on the caller may not read (warned): as a first deploy."""
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    if why == "no add-on":
        del fake.addons[CLUSTER_NAME]
    else:
        fake.denied.add(GET_ADDON)
    fake.coredns_versions["1.34"] = LATER_COREDNS_BUILD
    second = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert coredns_version(second) == LATER_COREDNS_BUILD


def observability_version(plan: Preview) -> str:
    return plan.one(ADDON, OBSERVABILITY_ADDON).inputs["addonVersion"]


def test_the_observability_add_on_is_kept_as_coredns_is():
    """The same rule (`infra.resources.cluster.addon_version`): the live version while
    kubernetesVersion stays, the newest for the new version once it moves."""
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    assert fake.addons[CLUSTER_NAME][OBSERVABILITY_ADDON] == OBSERVABILITY_VERSIONS["1.34"]
    fake.observability_versions["1.34"] = LATER_OBSERVABILITY_BUILD
    fake.observability_versions["1.35"] = LATER_OBSERVABILITY_BUILD
    kept = run_program(dev_config(kubernetesVersion="1.34"), fake)
    assert observability_version(kept) == OBSERVABILITY_VERSIONS["1.34"]
    upgraded = run_program(dev_config(kubernetesVersion="1.35"), fake)
    assert observability_version(upgraded) == LATER_OBSERVABILITY_BUILD
    # Turned off and on again: the add-on is gone from the cluster, so it comes back at the newest.
    del fake.addons[CLUSTER_NAME][OBSERVABILITY_ADDON]
    assert (
        observability_version(run_program(dev_config(kubernetesVersion="1.34"), fake))
        == LATER_OBSERVABILITY_BUILD
    )


def test_the_node_monitoring_agent_is_kept_as_coredns_is():
    """The same rule again: an unrelated `pulumi up` leaves the agent (and with OVERWRITE, its
    DaemonSets) at the live build; a kubernetesVersion move takes the newest for the new version."""
    fake = after_first_deploy(FakeAccount(region="us-east-2"), kubernetesVersion="1.34")
    assert fake.addons[CLUSTER_NAME][NODE_MONITORING_ADDON] == NODE_MONITORING_VERSIONS["1.34"]
    fake.node_monitoring_versions["1.34"] = fake.node_monitoring_versions["1.35"] = (
        LATER_NODE_MONITORING_BUILD
    )

    def agent_version(plan: Preview) -> str:
        return plan.one(ADDON, NODE_MONITORING_ADDON).inputs["addonVersion"]

    assert (
        agent_version(run_program(dev_config(kubernetesVersion="1.34"), fake))
        == NODE_MONITORING_VERSIONS["1.34"]
    )
    assert (
        agent_version(run_program(dev_config(kubernetesVersion="1.35"), fake)) == LATER_NODE_MONITORING_BUILD
    )


# --- gpuNodesAfterTraining: who owns the GPU node group's size ---------------------------------------

TRAINING_RUN = "pulumi-python:dynamic/workloads:TrainingRun"


def run_inputs_of(plan: Preview) -> dict:
    return {key: value for key, value in plan.one(TRAINING_RUN).inputs.items() if key != "__provider"}


US_EAST_1 = "us-east-1"


def images_of(plan: Preview) -> dict[str, str]:
    """Each image the plan runs: the Ray head's and each Helm release's (`<repository>:<tag>`)."""
    head = plan.one("kubernetes:ray.io/v1:RayCluster").inputs["spec"]["headGroupSpec"]["template"]["spec"]
    return {
        "ray": head["containers"][0]["image"],
        **{
            r.inputs[
                "chart"
            ]: f"{r.inputs['values']['image']['repository']}:{r.inputs['values']['image']['tag']}"
            for r in plan.of_type("kubernetes:helm.sh/v3:Release")
        },
    }


def newcomers_us_east_1(**overrides: str) -> dict[str, str]:
    """The us-east-1 stack as a newcomer sets it up: no digest given, the default image's tag."""
    config = config_of(ROOT / "Pulumi.us-east-1.yaml", **overrides)
    if "image" not in overrides:
        config.pop("eks-ray-train:image")
    return config


def move_every_tag(registries: FakeRegistries) -> None:
    """Each publisher moves its tag to other bits."""
    for host in registries.hosts.values():
        for repository, tag in list(host.manifests):
            host.push(repository, tag, index_manifest(repository, tag) + b"\n")


def test_a_live_stack_keeps_its_images_digests_when_their_tags_move():
    """Issue 60: read once at the first deploy, then kept from the stack's record, as CoreDNS's version
    is kept from the live cluster: a moved tag changes nothing until asked for."""
    fake = FakeAws(region=US_EAST_1)
    with serving_the_program(*the_programs_images(US_EAST_1)) as registries:
        first = run_program(newcomers_us_east_1(), fake, stack=US_EAST_1, preview=False)
        deployed_stack(first, fake)
        registries.stack_outputs = dict(first.outputs)  # what the backend holds after the `up`
        move_every_tag(registries)
        asked = len(registries.manifest_requests())
        second = run_program(newcomers_us_east_1(), fake, stack=US_EAST_1)
        assert images_of(second) == images_of(first) and len(registries.manifest_requests()) == asked
        assert registries.record_reads == [US_EAST_1]  # the stack's own outputs, by its name
        assert second.outputs["images"] == first.outputs["images"]
        # Asked for: `repinImages` reads every tag anew, and records the value with the new digests.
        third = run_program(newcomers_us_east_1(repinImages="2026-12-06"), fake, stack=US_EAST_1)
    moved = images_of(third)
    assert all(moved[name] != images_of(first)[name] for name in moved)
    assert third.outputs["images"]["repinImages"] == "2026-12-06"
    assert all("@sha256:" in image for image in moved.values())


def test_a_changed_image_tag_is_read_anew_and_the_charts_images_kept():
    fake = FakeAws(region=US_EAST_1)
    other = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.2"
    with serving_the_program(*the_programs_images(US_EAST_1), other) as registries:
        first = run_program(newcomers_us_east_1(), fake, stack=US_EAST_1, preview=False)
        deployed_stack(first, fake)
        registries.stack_outputs = dict(first.outputs)
        move_every_tag(registries)
        second = run_program(newcomers_us_east_1(image=other), fake, stack=US_EAST_1)
        asked = {r.path for r in registries.manifest_requests() if "v1.2" in r.path}
    before, after = images_of(first), images_of(second)
    assert after["ray"].startswith(f"{other}@sha256:") and asked
    assert {name: after[name] for name in after if name != "ray"} == {
        name: before[name] for name in before if name != "ray"
    }
    assert (
        other in second.outputs["images"]["digests"]
        and DEFAULT_IMAGE not in second.outputs["images"]["digests"]
    )


def test_kept_digests_ask_no_registry_so_an_unreachable_one_stops_nothing():
    fake = FakeAws(region=US_EAST_1)
    with serving_the_program(*the_programs_images(US_EAST_1)) as registries:
        first = run_program(newcomers_us_east_1(), fake, stack=US_EAST_1, preview=False)
        assert registries.record_reads == []  # no cluster ran yet
        deployed_stack(first, fake)
        registries.stack_outputs = dict(first.outputs)
        registries.down = True  # no registry answers
        assert images_of(run_program(newcomers_us_east_1(), fake, stack=US_EAST_1)) == images_of(first)
        # The record of a destroyed stack is gone with its cluster: a new one reads the tags anew.
        with pytest.raises(pulumi.RunError, match="the preview could not read the digest of tag"):
            run_program(newcomers_us_east_1(), FakeAws(region=US_EAST_1), stack=US_EAST_1)


def test_keep_owns_the_gpu_group_size_and_says_what_idle_nodes_cost(caplog):
    caplog.set_level(logging.INFO)
    plan = run_program(dev_config(), FakeAccount(region="us-east-2"))
    group = plan.one(NODE_GROUP, "gpu")
    assert group.inputs["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    assert group.ignore_changes == []
    assert run_inputs_of(plan)["gpu_nodes_after_training"] == "keep"
    # 2 x g6.12xlarge at the Price List's On-Demand price (the fake's): 2 x 4.6016 = 9.2032.
    assert "the 2 GPU nodes stay up after the run and bill US$ 9.20 an hour while idle" in caplog.text
    assert "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview" in caplog.text


def test_release_leaves_the_desired_size_to_the_training_run_across_two_ups(caplog):
    """The first `pulumi up` creates the group at 0 nodes, minimum 0; the run scales it out and then to
    0. The second plans the same group, still ignoring its desired size, and the same TrainingRun
    inputs, so neither the group nor the run changes: the group stays at 0 and the verdict stands."""
    caplog.set_level(logging.INFO)
    fake = FakeAccount(region="us-east-2")
    first = run_program(dev_config(gpuNodesAfterTraining="release"), fake)
    deployed(first, fake)
    (gpu_group,) = [
        g for g in fake.node_groups[CLUSTER_NAME].values() if g["labels"].get("role") == "gpu-worker"
    ]
    gpu_group["scalingConfig"]["desiredSize"] = 0  # what the TrainingRun left
    second = run_program(dev_config(gpuNodesAfterTraining="release"), fake)
    for plan in (first, second):
        group = plan.one(NODE_GROUP, "gpu")
        assert group.inputs["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 2}
        assert group.ignore_changes == ["scalingConfig.desiredSize"]
        assert plan.one(NODE_GROUP, "system").ignore_changes == []
    assert run_inputs_of(second) == run_inputs_of(first)
    inputs = run_inputs_of(second)
    assert inputs["gpu_nodes_after_training"] == "release" and inputs["gpu_node_count"] == 2
    assert inputs["node_group_name"] == "gpu"  # the group's own name, an output of the group
    assert "stay up after the run" not in caplog.text and "DEGRADED" not in caplog.text


def test_release_without_a_training_run_creates_the_group_at_its_size():
    """With `train: false` no run scales a released group out, so it starts at `gpuNodeCount`."""
    plan = run_program(
        dev_config(gpuNodesAfterTraining="release", train="false"), FakeAccount(region="us-east-2")
    )
    assert plan.one(NODE_GROUP, "gpu").inputs["scalingConfig"] == {
        "desiredSize": 2,
        "minSize": 0,
        "maxSize": 2,
    }
    assert plan.of_type(TRAINING_RUN) == []


def test_a_gpu_zone_move_under_release_leaves_the_new_group_at_0_and_the_verdict_standing():
    """The move replaces the GPU node group (EKS cannot move a group's subnets), and the engine creates
    a replacement from the program's inputs, ignored ones included: at 0 nodes. No input of the job
    changes, so the TrainingRun is not run again; the group's new name (unknown at preview) makes it
    an update, which releases the new group should it run nodes (tests/workloads/training_run/)."""
    fake = FakeAccount(region="us-east-2")
    first = run_program(dev_config(gpuNodesAfterTraining="release"), fake)
    moved = run_program(
        dev_config(gpuNodesAfterTraining="release", gpuAz="us-east-2b"), deployed(first, fake)
    )
    group = moved.one(NODE_GROUP, "gpu")
    assert group.inputs["subnetIds"][0] != first.one(NODE_GROUP, "gpu").inputs["subnetIds"][0]
    assert group.inputs["subnetIds"][0].endswith("-private-us-east-2b-id") and group.delete_before_replace
    assert group.inputs["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 2}
    recorded, news = run_inputs_of(first), {**run_inputs_of(moved), "node_group_name": rpc.UNKNOWN}
    assert recorded == run_inputs_of(moved)  # every job input as it was
    diff = diff_props(recorded, news)
    assert diff.changes is True and diff.replaces == []


def test_a_degraded_gpu_group_is_warned_about_at_preview_with_the_fix(caplog):
    caplog.set_level(logging.WARNING)
    fake = after_first_deploy(FakeAccount(region="us-east-2"), gpuNodesAfterTraining="release")
    name, group = next(
        (n, g) for n, g in fake.node_groups[CLUSTER_NAME].items() if g["labels"].get("role") == "gpu-worker"
    )
    group["status"], group["scalingConfig"]["desiredSize"] = "DEGRADED", 0
    run_program(dev_config(gpuNodesAfterTraining="release"), fake)
    assert f"GPU node group {name} is DEGRADED at 0 of 2 nodes" in caplog.text
    assert f"--nodegroup-name {name} --region us-east-2 --query nodegroup.health.issues" in caplog.text
    assert f"--nodegroup-name {name} --scaling-config desiredSize=2 --region us-east-2" in caplog.text


# The fake cluster's endpoint host, as a URL's host is read: in lowercase.
ENDPOINT_HOST = "0123456789abcdef0123456789abcdef.gr7.us-east-2.eks.amazonaws.com"


def private(**overrides: str) -> dict[str, str]:
    """The dev stack with the public endpoint off, and so without its CIDRs."""
    config = dev_config(endpointPublicAccess="false", **overrides)
    config.pop("eks-ray-train:endpointPublicAccessCidrs")
    return config


def test_a_private_endpoint_on_a_stack_not_yet_deployed_is_refused_with_the_way_there():
    """Issue 53: no machine is inside a VPC the stack has yet to create."""
    with pytest.raises(pulumi.RunError) as raised:
        run_program(private(), FakeAccount(region="us-east-2"))
    message = str(raised.value)
    assert message.startswith("config key 'endpointPublicAccess' = false: no cluster of clusterName runs yet")
    assert "create the stack with endpointPublicAccess true" in message and "\n" not in message
    assert raised.value.plan.resources == []


@pytest.mark.parametrize(
    "addresses, accepting, problem",
    [
        ([], [], f"the cluster's endpoint {ENDPOINT_HOST} does not resolve on this machine"),
        (
            ["3.14.15.92", "2600:1f16::1"],
            ["3.14.15.92"],
            f"this machine resolves the cluster's endpoint {ENDPOINT_HOST} to 3.14.15.92, 2600:1f16::1, outside "
            "the cluster's VPC (10.0.0.0/16)",
        ),
        (
            ["10.0.1.17", "10.0.70.4"],
            [],
            f"the cluster's endpoint {ENDPOINT_HOST} resolves to 10.0.1.17, 10.0.70.4 in its VPC, but none accepted "
            "a connection on port 443 from this machine: the cluster security group",
        ),
    ],
    ids=["unresolved", "public-addresses", "security-group"],
)
def test_a_private_endpoint_this_machine_cannot_reach_is_refused(monkeypatch, addresses, accepting, problem):
    fake = after_first_deploy(FakeAccount(region="us-east-2"))
    tried: list[tuple[str, int]] = []
    monkeypatch.setattr(
        live_cluster, "resolve", lambda host, port: addresses if host == ENDPOINT_HOST else []
    )
    monkeypatch.setattr(
        live_cluster, "accepts", lambda address, port: tried.append((address, port)) or address in accepting
    )
    with pytest.raises(pulumi.RunError) as raised:
        run_program(private(), fake)
    message = str(raised.value)
    assert message.startswith(f"config key 'endpointPublicAccess' = false: {problem}"), message
    assert "\n" not in message and raised.value.plan.resources == []
    assert all(address.startswith("10.0.") and port == 443 for address, port in tried)  # only the VPC's


def test_a_private_endpoint_this_machine_reaches_turns_the_public_one_off(monkeypatch):
    fake = after_first_deploy(FakeAccount(region="us-east-2"))
    monkeypatch.setattr(live_cluster, "resolve", lambda host, port: ["10.0.1.17", "10.0.70.4"])
    monkeypatch.setattr(live_cluster, "accepts", lambda address, port: address == "10.0.70.4")
    cluster = run_program(private(), fake).one("eks:index:Cluster").inputs
    assert cluster["endpointPublicAccess"] is False and cluster["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in cluster


# --- a deadline that passed after the run --------------------------------------------------------

# 3 h after NOW: the first `pulumi up` (a new stack: control plane, nodes, image, gate) fits well before it.
DEADLINE = '{"preset": "smoke", "steps": 20, "deadline": "2026-12-05T12:00:00Z"}'
NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def test_a_deployed_stack_previewed_two_days_after_its_deadline_plans_with_a_warning(caplog):
    """The job ran before its deadline at the first `pulumi up`. Two days later another change is
    planned: the TrainingRun's inputs are the same (its --deadline is absolute), so its Diff finds no
    change and it does not run; the preview, which cannot read whether it finished, warns instead of
    refusing. Without a cluster the same preview is still refused."""
    fake = FakeAccount(region="us-east-2")
    first = run_program(dev_config(training=DEADLINE), fake, now=NOW)
    deployed(first, fake)
    caplog.set_level(logging.WARNING)
    later = run_program(dev_config(training=DEADLINE, systemNodeCount="2"), fake, now=NOW + timedelta(days=2))
    assert later.one(NODE_GROUP, "system").inputs["scalingConfig"]["desiredSize"] == 2  # the change, planned
    assert run_inputs_of(later) == run_inputs_of(first)
    assert not diff_props(run_inputs_of(first), run_inputs_of(later)).changes
    (warning,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run window: ")]
    assert warning.startswith(
        "run window: training.deadline 2026-12-05T12:00:00Z. Predicted: start-up GPU nodes 5 min + image pull "
        "10 min + fabric gate 1 min: the job starts about 2026-12-07T09:16:00Z, after the deadline"
    )
    assert "not even one checkpointed step fits. The cluster exists" in warning
    assert "refused when it starts, before any GPU node is scaled or job submitted" in warning
    assert warning.endswith("To run the job again, set a later training.deadline, or remove it")
    with pytest.raises(pulumi.RunError) as raised:
        run_program(
            dev_config(training=DEADLINE), FakeAccount(region="us-east-2"), now=NOW + timedelta(days=2)
        )
    assert str(raised.value).startswith("config key 'training.deadline' = '2026-12-05T12:00:00Z': ")
    assert raised.value.plan.resources == []


# --- a live cluster that cannot be read -----------------------------------------------------------

GET_CLUSTER = "aws:eks/getCluster:getCluster"


@pytest.mark.parametrize(
    ("token", "failure", "action", "fix"),
    [
        (
            GET_CLUSTER,
            "denied",
            "eks:DescribeCluster",
            "allow eks:DescribeCluster to the identity running Pulumi",
        ),
        (
            GET_CLUSTER,
            "throttled",
            "eks:DescribeCluster",
            "AWS throttled the account's eks:DescribeCluster calls",
        ),
        ("aws:ec2/getSubnet:getSubnet", "denied", "ec2:DescribeSubnets", "allow ec2:DescribeSubnets"),
    ],
)
def test_a_live_cluster_that_cannot_be_read_stops_the_preview_naming_the_permission(
    token, failure, action, fix
):
    """Planned as new, a live stack would get its zones, subnets and GPU zone chosen anew from today's
    offerings (`test_a_live_cluster_keeps_its_zones_when_aws_adds_an_offering`): nothing is planned
    until the read works."""
    fake = after_first_deploy(FakeAccount(region="us-east-2"))
    getattr(fake, failure).add(token)
    message = refusal(fake)
    assert message.startswith("config key 'clusterName' = 'eks-ray-train': could not read ")
    assert f"in us-east-2 ({action}: " in message and fix in message
    assert "would plan its zones, subnets and GPU node group anew" in message and "\n" not in message


def test_a_denied_cluster_read_stops_a_first_preview_too():
    """No read, no telling a new stack from a live one; and every `pulumi up` calls DescribeCluster."""
    message = refusal(FakeAccount(region="us-east-2", denied={GET_CLUSTER}))
    assert "could not read EKS cluster eks-ray-train in us-east-2 (eks:DescribeCluster: " in message
    assert "AccessDeniedException" in message
