"""Where a node's EFA byte counters are and how they read, declared once for both readers: the
TrainingRun's exec into each worker pod (`workloads.training_run.verdicts.efa_counters`, around a job) and
the training job's own first rank of each node (`training.metrics.efa_meter`, at every step). Standard
library only: this package is shipped to the pods and imports nothing of the program.

The EFA kernel driver (amzn/amzn-drivers, kernel/linux/efa/src/efa_verbs.c, `EFA_DEFINE_PORT_STATS`)
exposes per-port counters through the RDMA core's sysfs, one decimal number per file (`%llu\\n`), at
`/sys/class/infiniband/<device>/ports/<port>/hw_counters/<name>` (an EFA device has one port). A
pod sees the node's devices there: sysfs is mounted into every container. The counters are the
node's, not the pod's, which is what is wanted with one Ray worker pod per node.

`SYSFS_ROOT_ENV` points the training job at another root: tests and demos fake a node's counters
with a folder of that shape.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

SYSFS_ROOT = "/sys/class/infiniband"
SYSFS_ROOT_ENV = "TRAINING_EFA_SYSFS_ROOT"
# A counter file below the root: `<device>/ports/<port>/hw_counters/<name>`.
COUNTER_GLOB = "*/ports/*/hw_counters"
COUNTER_PATH = re.compile(r"([^/\s]+)/ports/(\d+)/hw_counters/(\w+)")
# The counters read, by their driver names: bytes and packets through the port, by RDMA read and
# write and by send/receive, and the signs of a sick fabric. Older drivers lack some (rdma_write_*
# came with newer devices); a missing file is simply not reported.
COUNTERS = (
    "tx_bytes",
    "rx_bytes",
    "tx_pkts",
    "rx_pkts",
    "send_bytes",
    "recv_bytes",
    "rdma_read_bytes",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "impaired_remote_conn_events",
    "unresponsive_remote_events",
)
MOVED = ("tx_bytes", "rx_bytes")  # the port's bytes sent and received, whatever the verb


def sysfs_root(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(SYSFS_ROOT_ENV) or SYSFS_ROOT


def port_name(device: str, port: str) -> str:
    return f"{device}/{port}"


def read_moved_bytes(root: str) -> dict[str, int]:
    """Bytes sent plus received so far through each EFA port under `root` (`<device>/<port>`); an
    empty dict on a machine without EFA (no such folder, or no port counters in it)."""
    ports: dict[str, int] = {}
    for folder in sorted(Path(root).glob(COUNTER_GLOB)):
        values = []
        for name in MOVED:
            try:
                values.append(int((folder / name).read_text().strip()))
            except (OSError, ValueError):
                continue
        if values:
            ports[port_name(folder.parents[2].name, folder.parent.name)] = sum(values)
    return ports
