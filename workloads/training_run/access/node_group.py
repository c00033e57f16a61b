"""The GPU node group's size, through the EKS API, for `gpuNodesAfterTraining: release`.

Two calls (EKS API reference, REST-JSON): `DescribeNodegroup` (`GET /clusters/<cluster>/node-groups/
<group>`) gives the group's `status` (CREATING, ACTIVE, UPDATING, DELETING, CREATE_FAILED,
DELETE_FAILED, DEGRADED), its `scalingConfig` and its `health.issues` (`code`, `message`,
`resourceIds`); `UpdateNodegroupConfig` (`POST .../update-config`) with `scalingConfig.desiredSize`
alone changes the desired size and nothing the program owns (minimum, maximum), and answers an
`update` whose `createdAt` is when EKS accepted it. EKS refuses an update of a group that is not
ACTIVE with ResourceInUseException ("Nodegroup cannot be updated as it is currently not in Active
State", aws/containers-roadmap#2204). Every call is bounded as the DescribeCluster call is
(`eks_auth.aws_client_config`); a refusal becomes a `TrainingRunError` naming the call and the group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import botocore.exceptions

from infra.aws_rules.reservation_window import utc_text
from workloads.training_run.errors import TrainingRunError, aws_refusal


@dataclass(frozen=True)
class NodeGroupFacts:
    """What DescribeNodegroup says of the group that the run needs."""

    name: str
    status: str
    desired_size: int
    issues: tuple[str, ...] = ()  # "code: message (resource ids)", one per health issue


class NodeGroupSizer(Protocol):
    """Reads the GPU node group and sets its desired size (the real one is `EksNodeGroup`)."""

    def describe(self) -> NodeGroupFacts: ...

    def set_desired_size(self, size: int) -> str:
        """Ask EKS for `size` nodes; the time EKS accepted it, ISO 8601 UTC."""
        ...


def _issue(issue: dict[str, Any]) -> str:
    resources = ", ".join(issue.get("resourceIds") or [])
    return f"{issue.get('code', 'Unknown')}: {issue.get('message', '')}" + (
        f" ({resources})" if resources else ""
    )


class EksNodeGroup:
    """`NodeGroupSizer` over a botocore `eks` client."""

    def __init__(self, eks: Any, cluster_name: str, node_group_name: str, region: str) -> None:
        self.eks, self.cluster, self.name, self.region = eks, cluster_name, node_group_name, region

    def _call(self, operation: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except botocore.exceptions.ClientError as error:
            raise TrainingRunError(
                f"AWS refused {operation} of node group {self.name} of EKS cluster {self.cluster} in "
                f"{self.region}: {aws_refusal(error)}"
            ) from error
        except botocore.exceptions.BotoCoreError as error:
            raise TrainingRunError(
                f"the EKS API in {self.region} did not answer {operation} of node group {self.name}: {error}"
            ) from error

    def describe(self) -> NodeGroupFacts:
        group = self._call(
            "DescribeNodegroup",
            lambda: self.eks.describe_nodegroup(clusterName=self.cluster, nodegroupName=self.name),
        )["nodegroup"]
        return NodeGroupFacts(
            name=self.name,
            status=group["status"],
            desired_size=group.get("scalingConfig", {}).get("desiredSize", 0),
            issues=tuple(_issue(issue) for issue in group.get("health", {}).get("issues", [])),
        )

    def set_desired_size(self, size: int) -> str:
        update = self._call(
            "UpdateNodegroupConfig",
            lambda: self.eks.update_nodegroup_config(
                clusterName=self.cluster, nodegroupName=self.name, scalingConfig={"desiredSize": size}
            ),
        )["update"]
        return utc_text(update["createdAt"])
