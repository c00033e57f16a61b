"""The GPU node group's size with `gpuNodesAfterTraining: release`: scaled out before a run, to 0 after it.

Before the readiness wait, the GPU node group, found at fewer nodes than the run needs (0 after the
last run), is scaled to `gpuNodeCount` (`scale_gpu_nodes_up`); readiness's GPU node wait then covers
their joining. A DEGRADED group is refused instead (`node_group_problem`). After the run the group
goes back to 0 (`release_gpu_nodes`), whatever the verdict, once every job the run started or
followed has ended (`TrainingRunner.run`). The job writes its own checkpoints before it ends; EKS
drains a node it removes and terminates it after 5 minutes at most, so nothing is left to write
then. A run that stops while a job still runs (Ctrl-C, `timeout_minutes`, a cluster it cannot
reach) leaves the nodes running for the job and says so.
"""

from __future__ import annotations

from collections.abc import Callable

from workloads.training_run.access.node_group import NodeGroupFacts, NodeGroupSizer
from workloads.training_run.errors import TrainingRunError
from workloads.training_run.readiness import Pace

# States in which EKS takes no resize (ResourceInUseException) but will again: waited out.
NODE_GROUP_SETTLING = frozenset({"CREATING", "UPDATING"})
# States in which EKS takes a resize: ACTIVE, and DEGRADED, which a scale-out that succeeds ends
# (aws/containers-roadmap#2326: a group stays DEGRADED, even scaled to 0, until then).
NODE_GROUP_RESIZABLE = frozenset({"ACTIVE", "DEGRADED"})


def node_group_problem(group: NodeGroupFacts, cluster: str, region: str, wanted: int) -> str | None:
    """Why the run does not scale the GPU node group out to `wanted` nodes (None: it may).

    A DEGRADED group is refused, not retried: its cause (no capacity, a quota, no free addresses in
    the subnet) outlives the retry, which would hold `pulumi up` for the whole readiness wait."""
    describe = (
        f"aws eks describe-nodegroup --cluster-name {cluster} --nodegroup-name {group.name} --region {region}"
    )
    if group.status == "DEGRADED":
        issues = "; ".join(group.issues) or "EKS lists no health issue"
        return (
            f"GPU node group {group.name} of EKS cluster {cluster} is DEGRADED ({issues}), so the run does not "
            "scale it out: EKS keeps a managed node group DEGRADED, even at 0 nodes, until one of its scale-outs "
            "succeeds. Fix the cause named above, then scale it out yourself with `aws eks update-nodegroup-config "
            f"--cluster-name {cluster} --nodegroup-name {group.name} --scaling-config desiredSize={wanted} "
            f"--region {region}` and, once `{describe}` says ACTIVE, run `pulumi up` again"
        )
    if group.status not in NODE_GROUP_RESIZABLE | NODE_GROUP_SETTLING:
        return (
            f"GPU node group {group.name} of EKS cluster {cluster} is {group.status}, and EKS resizes only an ACTIVE "
            f"group: `{describe}` says why; `pulumi refresh` then `pulumi up` re-creates a group that failed or is gone"
        )
    return None


def wait_for_node_group(sizer: NodeGroupSizer, pace: Pace, timeout_s: float) -> NodeGroupFacts:
    """The group once EKS would take a resize of it (not CREATING or UPDATING)."""

    def attempt():
        group = sizer.describe()
        return group.status not in NODE_GROUP_SETTLING, group

    settled, group = pace.until(timeout_s, attempt)
    if not settled:
        raise TrainingRunError(
            f"GPU node group {group.name} is still {group.status} after {timeout_s / 60:.0f} min, and EKS resizes "
            "no group meanwhile: run `pulumi up` again once `aws eks describe-nodegroup` says ACTIVE"
        )
    return group


def scale_gpu_nodes_up(
    sizer: NodeGroupSizer,
    pace: Pace,
    timeout_s: float,
    wanted: int,
    where: tuple[str, str],
    log: Callable[[str], None],
    block_began: bool = False,
) -> None:
    """Scale the GPU node group (in `where`: cluster, region) to `wanted` nodes when it has fewer;
    the GPU node wait that follows covers their joining.

    `block_began`: the run has just waited for a Capacity Block's start. A group created before it
    at `wanted` nodes had its launches fail until then, and Auto Scaling launches them once the
    block is active (EKS user guide, "Create a managed node group with Capacity Blocks for ML"), so
    a DEGRADED status from those failures is waited out, not refused."""
    group = wait_for_node_group(sizer, pace, timeout_s)
    if block_began and group.status == "DEGRADED" and group.desired_size >= wanted:
        log(
            f"training run: GPU node group {group.name} is DEGRADED from its launches before the Capacity Block "
            "began; Auto Scaling launches its nodes now that the block is active: waiting for them"
        )
        return
    problem = node_group_problem(group, *where, wanted)
    if problem:
        raise TrainingRunError(problem)
    if group.desired_size >= wanted:
        return
    sizer.set_desired_size(wanted)
    log(
        f"training run: GPU node group {group.name} scaled from {group.desired_size} to {wanted} nodes "
        "(gpuNodesAfterTraining: release); waiting for them to join the cluster"
    )


def release_gpu_nodes(
    sizer: NodeGroupSizer, pace: Pace, timeout_s: float, wanted: int, log: Callable[[str], None]
) -> str | None:
    """Scale the GPU node group to 0 once the job has ended: when EKS accepted it (ISO 8601 UTC);
    None when the group already stood at 0."""
    group = wait_for_node_group(sizer, pace, timeout_s)
    if group.desired_size == 0:
        return None
    released_at = sizer.set_desired_size(0)
    log(
        f"training run: GPU node group {group.name} scaled from {group.desired_size} to 0 nodes at {released_at} "
        "(gpuNodesAfterTraining: release): EKS drains each node and terminates it, forcibly after 5 minutes; the "
        f"next run that needs them scales the group back to {wanted}"
    )
    return released_at
