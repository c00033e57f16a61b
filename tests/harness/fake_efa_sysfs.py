"""A GPU node's EFA counters, and the traffic the fakes add to them.

- A worker node's EFA port counters (`FakeEfaSysfs`), as the EFA kernel driver exposes them through
  the RDMA core's sysfs (amzn/amzn-drivers kernel/linux/efa/src/efa_verbs.c, `EFA_DEFINE_PORT_STATS`;
  the RDMA core prints each as `%llu\n`): `<device>/ports/1/hw_counters/<name>`, one decimal number
  per file, growing while the job's traffic goes through the port. They belong to the node, and only
  the host's network namespace sees them: a pod on the pod network (a Ray worker) sees a compat copy
  of the device whose port has attributes but no `hw_counters` (Linux drivers/infiniband/core/device.c
  `add_one_compat_dev`; sysfs.c `setup_port` adds `hw_counters` only `if (port_num && is_full_dev)`),
  while a `hostNetwork` pod (the EFA counter reader, `reader_pod`) sees the full device. A scripted job
  adds its `efa_traffic` to every worker node once submitted (a `stuck` device's counters stay put).
"""

from __future__ import annotations

from pathlib import Path

# What the gate's probe adds to each worker node's counters (the fixture report's run, driver_probe.log:
# 8 ranks on 2 nodes, 25 calls of each collective at 1 MiB, 16 MiB, 256 MiB and 1 GiB): on NCCL's
# ring each node sends and receives 7/8 of each all_gather's and reduce_scatter's message and 14/8
# of each all_reduce's, 3.5 x 1297 MiB x 25 each way (nccl-tests doc/PERFORMANCE.md, the ring's bus
# factors).
PROBE_TRAFFIC = {
    "tx_bytes": 119_000_268_800,
    "rx_bytes": 119_000_272_896,
    "tx_pkts": 14_525_000,
    "rx_pkts": 14_525_004,
}
# What connection set-up alone moves (libfabric's handshakes): tens of KiB.
HANDSHAKE_TRAFFIC = {"tx_bytes": 32_768, "rx_bytes": 32_768, "tx_pkts": 64, "rx_pkts": 64}
# What a node's EFA counters hold before a job: earlier traffic (counters live as long as the device).
EFA_DEVICE = "rdmap16s27"
EFA_COUNTERS_AT_BOOT = {
    "tx_bytes": 7_340_032_000,
    "rx_bytes": 7_340_032_512,
    "tx_pkts": 870_000,
    "rx_pkts": 870_004,
    "send_bytes": 1_048_576,
    "recv_bytes": 1_048_576,
    "rdma_read_bytes": 7_338_983_424,
    "rdma_write_bytes": 0,
    "retrans_pkts": 3,
    "impaired_remote_conn_events": 0,
}


class FakeEfaSysfs:
    """One node's `/sys/class/infiniband`, in both views the kernel gives (module doc): `root`, the
    host's network namespace's, an EFA device with one port and its `hw_counters` files; `pod_view`,
    a pod network namespace's, the compat device whose port has attributes (`state`) but no
    `hw_counters`. A `stuck` device's counters do not move whatever the traffic."""

    def __init__(self, root: Path, device: str = EFA_DEVICE, counters: dict[str, int] | None = None):
        self.root = root
        self.pod_view = root.parent / f"{root.name}-pod-netns"
        self.stuck = False
        self.folder = root / device / "ports" / "1" / "hw_counters"
        self.folder.mkdir(parents=True, exist_ok=True)
        for view in (root, self.pod_view):
            port = view / device / "ports" / "1"
            port.mkdir(parents=True, exist_ok=True)
            (port / "state").write_text("4: ACTIVE\n")
        self.counters = dict(EFA_COUNTERS_AT_BOOT if counters is None else counters)
        self._write()

    def add(self, traffic: dict[str, int]) -> None:
        if self.stuck:
            return
        for name, count in traffic.items():
            self.counters[name] = self.counters.get(name, 0) + count
        self._write()

    def _write(self) -> None:
        for name, value in self.counters.items():
            (self.folder / name).write_text(f"{value}\n")
