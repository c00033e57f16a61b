"""EKS node auto repair and the EKS node monitoring agent: the figures the GPU node group, the add-on and
the training job's restart window rest on, each declared once with its source.

The agent (a DaemonSet of the `eks-node-monitoring-agent` add-on) reads each node's kernel, runtime,
storage, network and NVIDIA logs and sets node conditions (`AcceleratedHardwareReady`, `KernelReady`,
`NetworkingReady`, `StorageReady`, `ContainerRuntimeReady`); a managed node group with
`nodeRepairConfig.enabled` reboots or replaces a node that keeps an unhealthy condition (EKS user
guide, "Automatically repair nodes in EKS clusters" and "Detect node health issues with the EKS node
monitoring agent"). A replacement drains the node first: its pods get SIGTERM and their
`terminationGracePeriodSeconds` (`workloads.manifests.raycluster`), which the Ray worker turns into
a drain the job checkpoints on ([operations](docs/operations/node-repair.md)).
"""

from __future__ import annotations

from platform_contract import GPU_TOLERATION

# The add-on's name (EKS user guide, "Detect node health issues with the EKS node monitoring agent").
ADDON_NAME = "eks-node-monitoring-agent"

# How long EKS waits on an unhealthy GPU condition before it repairs the node (EKS user guide,
# "Automatically repair nodes in EKS clusters", the table of node conditions: AcceleratedHardwareReady,
# "Repair after" 10m; a node that is NotReady, 30m).
ACCELERATED_HARDWARE_REPAIR_AFTER_S = 10 * 60
NOT_READY_REPAIR_AFTER_S = 30 * 60

# What a lost GPU node costs the job before a restart can place its workers again: the managed node
# group launches a replacement (the EC2 launch, the AL2023 NVIDIA AMI's boot and the node joining),
# the device plugins make its GPUs and EFA interfaces allocatable, and KubeRay's new worker pod pulls
# the Ray Train image (about 20 GB, no cache on a fresh node) and starts its raylet. None of it is
# measured here (no AWS); 20 minutes is an upper bound we state rather than a figure we took. Ray
# Train waits this long for a restarted worker group (`RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`,
# whose own default of 60 s, ray/train/v2/_internal/constants.py, no new node meets).
NODE_REPLACEMENT_S = 20 * 60

# The job's --recovery-budget-s on a stack with auto repair, unless `training.recoveryBudgetS` sets
# it: a node taken out of the job (`--leave-failing-node`) is repaired after its condition's wait (a
# NotReady node's 30 minutes is the longest) and then replaced; the restarts before it come on top.
# 50 minutes; the job's presets' 30 minutes fit a replacement alone.
REPAIRED_NODE_RECOVERY_S = NOT_READY_REPAIR_AFTER_S + NODE_REPLACEMENT_S


def addon_configuration() -> dict:
    """The add-on's configuration values (its chart's values; the add-on's configuration schema,
    aws/eks-node-monitoring-agent charts/configuration.schema.json, admits `dcgmAgent.tolerations`).

    The node agent tolerates every taint by its chart's default (`nodeAgent.tolerations`: operator
    Exists), so it runs on the GPU nodes as it is. Its DCGM server, which the agent's NVIDIA monitor
    asks for GPU diagnostics, tolerates none by default (`dcgmAgent.tolerations: []`), and the GPU
    nodes carry the GPU taint: it is given the GPU toleration.
    """
    return {"dcgmAgent": {"tolerations": [dict(GPU_TOLERATION)]}}
