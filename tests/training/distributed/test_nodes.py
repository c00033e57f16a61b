"""Each rank's node (training/distributed/nodes.py): the pod's Kubernetes node else the hostname, and
every rank's gathered in one collective."""

from __future__ import annotations

import socket

from training.config.settings import NODE_NAME_ENV
from training.distributed.nodes import gather_nodes, this_node


def test_a_worker_names_its_pods_kubernetes_node_else_the_machines_hostname(monkeypatch):
    """On a cluster the pod's hostname is the pod's name; the node, which `kubectl cordon` takes and a
    replacement pod shares, comes from the downward API (workloads/manifests/raycluster.py)."""
    monkeypatch.setenv(NODE_NAME_ENV, "ip-10-0-1-23.us-east-2.compute.internal")
    assert this_node() == "ip-10-0-1-23.us-east-2.compute.internal"
    monkeypatch.delenv(NODE_NAME_ENV)
    assert this_node() == socket.gethostname()


def test_without_a_process_group_the_nodes_are_this_ranks_alone():
    assert gather_nodes("ip-10-0-1-23") == ["ip-10-0-1-23"]
