"""Managed node groups: the system group, and the GPU group with our own EFA launch template.

`aws.eks.NodeGroup` is used rather than pulumi-eks's `ManagedNodeGroup` because the GPU group
needs a launch template of its own (EFA interfaces, placement group, capacity reservation, IMDSv2,
root volume), which `enable_efa_support` cannot be combined with, and because every property then
shows in `pulumi preview` and in the offline tests.

With a capacity reservation the GPU group creates no placement group: EC2 launches into a
targeted reservation only when the launch matches it, placement included, so a fresh cluster
placement group around a reservation made outside it fails with InsufficientInstanceCapacity
(eksctl, for the same reason, creates a placement group only when no reservation is given). A
reservation created in a cluster placement group (`PlacementGroupArn`) is launched into that
group. A Capacity Block for ML launches as `CAPACITY_BLOCK` with the `capacity-block` market
type and the instance type in the launch template (EKS user guide, "Create a managed node group
with Capacity Blocks for ML").

Who owns the GPU group's size (`gpuNodesAfterTraining`). With `keep` the program does: minimum,
maximum and desired size are all `gpuNodeCount`, and a `pulumi up` sets them back if anyone changed
them. With `release` the program owns the bounds (minimum 0, maximum `gpuNodeCount`) and the
TrainingRun owns the desired size: it scales the group to `gpuNodeCount` before a run that needs the
nodes and to 0 once the job has ended. The program ignores the desired size (`ignore_changes`), so a
later `pulumi up`, with or without `--refresh`, leaves the group as the TrainingRun left it; and it
creates the group at 0 nodes, which the run scales out (at `gpuNodeCount` with `train: false`, where
no run would). A replacement (a new `gpuAz`, GPU type or capacity type) is created at 0 too: the
engine checks a replacement's inputs afresh from the program's, ignored ones included, where an
update takes an ignored property's old value (pulumi/pulumi pkg/resource/deploy/step_generator.go:
`processIgnoreChanges` on the old inputs in `generateSteps`, then, once the diff replaces, `Check`
of `goal.Properties` in `continueStepsFromDiff`). The system group always has a fixed size.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import yaml

from infra.aws_rules.ami_types import GPU_AMI_TYPE, SYSTEM_AMI_TYPE
from infra.aws_rules.capacity_rules import ReservationFacts
from infra.aws_rules.sizing import InstanceFacts
from platform_contract import GPU_LABELS, GPU_TAINT, SYSTEM_LABELS

# GPU nodes replaced at once in an update: a GPU node lost mid-update takes its Ray worker with it.
GPU_MAX_UNAVAILABLE = 1
# How EKS replaces GPU nodes in an update (a new launch template or AMI release). The DEFAULT
# strategy first launches max(2 x zones, maxUnavailable) extra nodes (EKS user guide, "Understand
# each phase of node updates"): 2 more g6.12xlarge, 96 vCPUs of GPU quota beyond what the preflight
# asks for, and room a reservation sized to the group does not have. MINIMAL terminates each old
# node before its replacement launches, "useful in scenarios where you are constrained to resources
# ... such as GPUs" (EKS API reference, NodegroupUpdateConfig.updateStrategy). A training job loses
# the node either way; the GPU group always updates with MINIMAL, one node at a time.
GPU_UPDATE_CONFIG = {"max_unavailable": GPU_MAX_UNAVAILABLE, "update_strategy": "MINIMAL"}


def node_repair_config(enabled: bool) -> aws.eks.NodeGroupNodeRepairConfigArgsDict:
    """The GPU group's node auto repair (EKS API `NodegroupNodeRepairConfig`), stated either way: off
    is written as `enabled: false`, so turning the stack key off turns a live group's repair off."""
    return {"enabled": enabled}


# The node group's desired size as Pulumi names the property (`ignore_changes` takes such paths).
DESIRED_SIZE_PROPERTY = "scalingConfig.desiredSize"
# IMDSv2 only, and a hop limit of 1: the metadata response dies at the pod network's extra hop, so
# pods cannot take the node role's credentials (EKS best practices, "Restrict access to the instance
# profile"). Pods get AWS credentials and the region from IRSA; host-network pods (VPC CNI,
# kube-proxy, device plugins) still reach the metadata service.
METADATA_OPTIONS: aws.ec2.LaunchTemplateMetadataOptionsArgsDict = {
    "http_endpoint": "enabled",
    "http_tokens": "required",
    "http_put_response_hop_limit": 1,
}
# Root volumes: the system nodes hold the Ray head's image (about 20 GB), the GPU nodes the workers'.
SYSTEM_ROOT_VOLUME_GIB = 80
GPU_ROOT_VOLUME_GIB = 200


# Locked memory on the GPU nodes: set, not inherited. The Ray workers drop every capability
# (`workloads.manifests.raycluster`), so every memory registration with the EFA device (libfabric's
# EFA provider and aws-ofi-nccl, through ibv_reg_mr) is charged to the container's RLIMIT_MEMLOCK
# (Linux drivers/infiniband/core/umem.c, `ib_umem_get`). A container whose OCI spec sets no such
# rlimit runs with containerd's own, which no source states for AL2023: the AL2 AMI set it unlimited
# through Docker's `default-ulimits` (awslabs/amazon-eks-ami templates/al2/runtime/docker-daemon.json,
# removed with AL2 in b2289030), and AL2023's base runtime spec sets RLIMIT_NOFILE alone
# (nodeadm/internal/containerd/base-runtime-spec.json at tag v20260724). The GPU nodes set it in that
# spec through their nodeadm NodeConfig (`spec.containerd.baseRuntimeSpec`, an object, nodeadm/api/
# v1alpha1/nodeconfig_types.go), whose rlimits containerd keeps in every container it creates
# (containerd v2.2.7 internal/cri/server/container_create.go: it drops them only for a runtime
# without a base spec). Rather than IPC_LOCK on the workers: the Ray namespace enforces the
# `baseline` Pod Security Standard, which refuses that capability.
#
# How nodeadm v20260724 writes the spec (nodeadm/internal/containerd/base_runtime_spec.go,
# `writeBaseRuntimeSpec`, through nodeadm/internal/util/merge.go, `Merge`), and what follows:
# - it merges ours into its default with mergo's WithOverride: objects merge key by key, so the
#   default's capabilities, mounts, namespaces and masked paths stay; a list replaces the default's
#   list whole, so ours restates the default's RLIMIT_NOFILE (65536 soft, 1048576 hard);
# - the merge decodes both into Go's `interface{}`, where every JSON number becomes a float64.
#   "Unlimited" (RLIM_INFINITY, 2^64 - 1) would come out as 18446744073709552000, which containerd
#   fails to parse into the spec's uint64 ("failed to parse base OCI spec file"), and with it its
#   CRI plugin: the node would never run a pod. So the limit is finite: 2^53 bytes (8 PiB), which a
#   float64 holds exactly and which is beyond any node's memory. In a pod, `ulimit -l` reads it as
#   8796093022208 (KiB); readiness still refuses a limit under its floor, as on a node that did not
#   take this config (`workloads.training_run.readiness.MIN_MEMLOCK_KIB`).
# Every container on a GPU node gets these limits, as every container on an AL2 node had unlimited.
CONTAINER_MEMLOCK_BYTES = 2**53
CONTAINER_RLIMITS = (
    {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576},
    {"type": "RLIMIT_MEMLOCK", "soft": CONTAINER_MEMLOCK_BYTES, "hard": CONTAINER_MEMLOCK_BYTES},
)
# nodeadm reads NodeConfig documents from the user data's MIME parts of this type
# (nodeadm/internal/configprovider/userdata.go, `nodeConfigMediaType`) and merges them
# (`ParseMultipart`); EKS adds its own part with the cluster's details to a managed node group's
# user data when the launch template names no AMI, as here, and this part needs none of them.
NODE_CONFIG_MEDIA_TYPE = "application/node.eks.aws"
USER_DATA_BOUNDARY = "==NODECONFIG=="


def gpu_node_config() -> dict:
    """The GPU nodes' NodeConfig: containerd's base runtime spec with the container rlimits above."""
    base_runtime_spec = {"process": {"rlimits": [dict(limit) for limit in CONTAINER_RLIMITS]}}
    return {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {"containerd": {"baseRuntimeSpec": base_runtime_spec}},
    }


def node_config_user_data(node_config: dict) -> str:
    """A launch template's user data (base64, as EC2 takes it): one MIME multipart document holding
    the NodeConfig, the form a managed node group on an AL2023 AMI takes its user data in."""
    document = "\n".join(
        [
            "MIME-Version: 1.0",
            f'Content-Type: multipart/mixed; boundary="{USER_DATA_BOUNDARY}"',
            "",
            f"--{USER_DATA_BOUNDARY}",
            f"Content-Type: {NODE_CONFIG_MEDIA_TYPE}",
            "",
            "---",
            yaml.safe_dump(node_config, sort_keys=False).rstrip("\n"),
            "",
            f"--{USER_DATA_BOUNDARY}--",
            "",
        ]
    )
    return base64.b64encode(document.encode()).decode()


def root_volume(size_gib: int) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgsDict]:
    """Encrypted gp3 root volume of the AL2023 AMIs (device /dev/xvda)."""
    return [
        {
            "device_name": "/dev/xvda",
            "ebs": {
                "volume_size": size_gib,
                "volume_type": "gp3",
                "encrypted": "true",
                "delete_on_termination": "true",
            },
        }
    ]


def efa_network_interfaces(
    efa_interfaces: int, security_group_ids: list[pulumi.Input[str]]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgsDict]:
    """One EFA interface per network card: card 0 carries IP traffic too, the others are EFA-only.

    Security groups sit on the interfaces (a launch template with interfaces may not set them at
    the top level) and no subnet is named: the node group chooses it.
    """
    return [
        {
            "network_card_index": card,
            "device_index": 0 if card == 0 else 1,
            "interface_type": "efa" if card == 0 else "efa-only",
            "security_groups": security_group_ids,
            "delete_on_termination": "true",
            "associate_public_ip_address": "false" if card == 0 else None,
        }
        for card in range(efa_interfaces)
    ]


@dataclass(frozen=True)
class NodeGroupSpec:
    """What differs between the two node groups. `released`: the group may stand at 0 nodes between
    runs and its desired size belongs to the TrainingRun (module doc); `trained`: the stack runs the
    TrainingRun (`train`), which scales a released group out before its job."""

    instance: InstanceFacts
    count: int
    root_volume_gib: int
    released: bool = False
    trained: bool = False

    @property
    def scaling_config(self) -> aws.eks.NodeGroupScalingConfigArgsDict:
        return {
            "desired_size": 0 if self.released and self.trained else self.count,
            "min_size": 0 if self.released else self.count,
            "max_size": self.count,
        }

    @property
    def ignored_changes(self) -> list[str]:
        """The desired size, when the TrainingRun owns it."""
        return [DESIRED_SIZE_PROPERTY] if self.released else []


def managed_node_group(
    name: str,
    *,
    parent: pulumi.Resource,
    cluster_name: pulumi.Input[str],
    node_role_arn: pulumi.Input[str],
    subnet_ids: list[pulumi.Input[str]],
    spec: NodeGroupSpec,
    template: aws.ec2.LaunchTemplate,
    ami_type: str,
    labels: dict[str, str],
    kubernetes_version: pulumi.Input[str],
    after: list[pulumi.Resource],
    capacity_block: bool = False,
    replace_first: bool = False,
    **extra,
) -> aws.eks.NodeGroup:
    """A managed node group on our launch template, sized by `spec`: On-Demand, or a Capacity Block's.

    A Capacity Block group names its instance type in the launch template, as the EKS guide asks,
    and so not here: CreateNodegroup fails when both name one (EKS API reference, instanceTypes).
    `kubernetes_version` is the control plane's: a group keeps the version it was created with, and
    EKS refuses the next control-plane upgrade while a group lags a minor version behind
    ("Nodegroups must be updated to match cluster version"). `replace_first`: a replacement deletes
    this group before it creates the new one (Pulumi's default creates first).
    """
    return aws.eks.NodeGroup(
        name,
        cluster_name=cluster_name,
        node_role_arn=node_role_arn,
        subnet_ids=subnet_ids,
        instance_types=None if capacity_block else [spec.instance.instance_type],
        ami_type=ami_type,
        capacity_type="CAPACITY_BLOCK" if capacity_block else "ON_DEMAND",
        scaling_config=spec.scaling_config,
        labels=labels,
        launch_template={"id": template.id, "version": template.latest_version.apply(str)},
        version=kubernetes_version,
        # The role's policies must outlive the nodes, or they cannot leave the cluster cleanly; the
        # nodes pull images through the NAT gateway, so its routes must be there first.
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=after,
            delete_before_replace=replace_first,
            ignore_changes=spec.ignored_changes,
        ),
        **extra,
    )


class SystemNodeGroup(pulumi.ComponentResource):
    """Nodes for the KubeRay operator, CoreDNS and the Ray head (no GPU)."""

    def __init__(
        self,
        name: str,
        *,
        cluster_name: pulumi.Input[str],
        node_role_arn: pulumi.Input[str],
        subnet_ids: list[pulumi.Input[str]],
        spec: NodeGroupSpec,
        kubernetes_version: pulumi.Input[str],
        after: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("eks-ray-train:infra:SystemNodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        template = aws.ec2.LaunchTemplate(
            name,
            description="System nodes: IMDSv2 and an encrypted gp3 root volume",
            metadata_options=METADATA_OPTIONS,
            block_device_mappings=root_volume(spec.root_volume_gib),
            opts=child,
        )
        self.node_group = managed_node_group(
            name,
            parent=self,
            cluster_name=cluster_name,
            node_role_arn=node_role_arn,
            subnet_ids=subnet_ids,
            spec=spec,
            template=template,
            ami_type=SYSTEM_AMI_TYPE,
            labels=SYSTEM_LABELS,
            kubernetes_version=kubernetes_version,
            after=after,
            # The Ray head's PodDisruptionBudget (`workloads.manifests.head_disruption_budget`) refuses
            # every eviction of it, so EKS's drain of a system node in an update of this group (a new
            # Kubernetes version, AMI or launch template) fails with PodEvictionFailure. Forced, the
            # update ends the head once the drain has failed (UpdateNodegroupVersion's `force`: "Force
            # the update if any Pod on the existing node group can't be drained due to a Pod
            # disruption budget issue"), and the TrainingRun submits the lost job again; a
            # `kubectl drain` of a system node still waits for the head.
            force_update_version=True,
        )
        self.register_outputs({"nodeGroupName": self.node_group.node_group_name})


class GpuNodeGroup(pulumi.ComponentResource):
    """EFA GPU nodes in one subnet of one AZ, packed in a cluster placement group (the reservation's, if any)."""

    def __init__(
        self,
        name: str,
        *,
        cluster_name: pulumi.Input[str],
        vpc_id: pulumi.Input[str],
        cluster_security_group_id: pulumi.Input[str],
        node_role_arn: pulumi.Input[str],
        subnet_id: pulumi.Input[str],
        zone: str,
        spec: NodeGroupSpec,
        reservation: ReservationFacts | None,
        kubernetes_version: pulumi.Input[str],
        after: list[pulumi.Resource],
        auto_repair: bool = True,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`auto_repair`: EKS node auto repair (`gpuNodeAutoRepair`); its health signals come from
        the node monitoring agent (`infra.resources.node_health`)."""
        super().__init__("eks-ray-train:infra:GpuNodeGroup", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # EFA's SRD traffic needs a group that admits everything from and to itself, both ways.
        self.efa_security_group = aws.ec2.SecurityGroup(
            f"{name}-efa",
            description="EFA: all traffic between members of this group",
            vpc_id=vpc_id,
            tags={"Name": f"{name}-efa"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-in",
            security_group_id=self.efa_security_group.id,
            referenced_security_group_id=self.efa_security_group.id,
            ip_protocol="-1",
            description="EFA from members",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out",
            security_group_id=self.efa_security_group.id,
            referenced_security_group_id=self.efa_security_group.id,
            ip_protocol="-1",
            description="EFA to members",
            opts=child,
        )
        template_args: dict = {}
        self.placement_group: aws.ec2.PlacementGroup | None = None
        if reservation is None:
            # One per zone: a cluster placement group holds instances of one zone, so a zone move
            # gets a new group (the alias keeps the group of stacks deployed before this naming).
            self.placement_group = aws.ec2.PlacementGroup(
                f"{name}-{zone}",
                strategy="cluster",
                opts=pulumi.ResourceOptions(parent=self, aliases=[pulumi.Alias(name=name)]),
            )
            template_args["placement"] = {"group_name": self.placement_group.name}
        else:
            template_args["capacity_reservation_specification"] = {
                "capacity_reservation_target": {"capacity_reservation_id": reservation.reservation_id}
            }
            if reservation.placement_group_name:
                template_args["placement"] = {"group_name": reservation.placement_group_name}
            if reservation.is_capacity_block:
                template_args["instance_market_options"] = {"market_type": "capacity-block"}
                template_args["instance_type"] = spec.instance.instance_type
        self.launch_template = aws.ec2.LaunchTemplate(
            name,
            description=f"GPU nodes: {spec.instance.efa_interfaces} EFA interface(s), "
            + ("placement group, IMDSv2" if "placement" in template_args else "capacity reservation, IMDSv2"),
            metadata_options=METADATA_OPTIONS,
            block_device_mappings=root_volume(spec.root_volume_gib),
            network_interfaces=efa_network_interfaces(
                spec.instance.efa_interfaces, [cluster_security_group_id, self.efa_security_group.id]
            ),
            # The container rlimits (CONTAINER_RLIMITS): a change rolls the group's nodes.
            user_data=node_config_user_data(gpu_node_config()),
            opts=child,
            **template_args,
        )
        self.node_group = managed_node_group(
            name,
            parent=self,
            cluster_name=cluster_name,
            node_role_arn=node_role_arn,
            subnet_ids=[subnet_id],
            spec=spec,
            template=self.launch_template,
            ami_type=GPU_AMI_TYPE,
            labels=GPU_LABELS,
            kubernetes_version=kubernetes_version,
            after=after,
            taints=[GPU_TAINT],
            capacity_block=bool(reservation and reservation.is_capacity_block),
            # A new zone, type or capacity type replaces the group. Created first, the new nodes
            # would need twice the GPU quota and could not join the placement group the old ones
            # hold in another zone (EC2 InvalidPlacementGroup.InUse): the old group goes first.
            replace_first=True,
            update_config=GPU_UPDATE_CONFIG,
            node_repair_config=node_repair_config(auto_repair),
        )
        placement = template_args.get("placement", {}).get("group_name")
        self.register_outputs({"nodeGroupName": self.node_group.node_group_name, "placementGroup": placement})
