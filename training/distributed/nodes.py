"""Each rank's node, gathered once at the start of an attempt: a fault is named by node, and the
node a restart must leave or refuse is judged against the nodes this attempt runs on
(`training.components.attempts`)."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist

# The Kubernetes node a pod runs on, from the downward API (`spec.nodeName`), which the RayCluster's
# workers carry (`workloads.manifests.raycluster`).
from training.config.settings import NODE_NAME_ENV


def this_node() -> str:
    """The node this rank runs on: its pod's Kubernetes node (`NODE_NAME_ENV`), else (`--local`, a
    bare Ray cluster, torchrun) the machine's hostname."""
    return os.environ.get(NODE_NAME_ENV) or socket.gethostname()


def gather_nodes(node: str) -> list[str]:
    """Every rank's `node`, by rank: one all-gather on the default process group (a collective every
    rank calls); `[node]` without one."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [node]
    nodes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node)
    return [str(each) for each in nodes]
