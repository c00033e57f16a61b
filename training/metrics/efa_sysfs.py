"""Where a node's EFA byte counters are, how they read, and how a node serves them, declared once
for every reader. Standard library only: this file is shipped to the pods and also runs on its own
(`python -c <this file> serve ...`) as the node's counter server.

The EFA kernel driver (amzn/amzn-drivers, kernel/linux/efa/src/efa_verbs.c, `EFA_DEFINE_PORT_STATS`)
exposes per-port counters through the RDMA core's sysfs, one decimal number per file (`%llu\\n`), at
`/sys/class/infiniband/<device>/ports/<port>/hw_counters/<name>` (an EFA device has one port).

Only the host's network namespace sees them. In the RDMA core's default "shared" netns mode a
process in another network namespace (every pod on the VPC CNI pod network) sees a *compat* copy
of each device (Linux drivers/infiniband/core/device.c, `add_one_compat_dev`), and the RDMA core
creates a port's `hw_counters` group only for the full device (drivers/infiniband/core/sysfs.c,
`setup_port`: `if (port_num && is_full_dev)`; the 2025 commit "RDMA/core: Don't expose hw_counters
outside of init net namespace" says so outright, and reading device-level counters from another
netns oopsed on older kernels, so nothing here reads `<device>/hw_counters`). So on EKS a node's
counters are read by the EFA counter reader, a `hostNetwork` DaemonSet pod on each GPU node
(`workloads.efa_counter_reader`), as the EFA device plugin and other EFA exporters read them:

- the TrainingRun execs `counters_command` in the reader pod of each worker's node, around a job;
- the training job's first rank of each node fetches `COUNTERS_URL_ENV` (the reader's server on
  the node's address, `counter_server`) at every step (`training.metrics.efa_meter`).

The server answers each connection on a thread of its own and drops a client that sends nothing for
`REQUEST_TIMEOUT_S`, so no client can hold back the others' reads; it listens on the node's IPv4 or
IPv6 address, whichever the pod is given (`status.hostIP`).

A process on the host itself (torchrun on an EC2 instance) reads the sysfs folder directly;
`SYSFS_ROOT_ENV` points a reader at another folder of that shape (tests fake a node with one).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SYSFS_ROOT = "/sys/class/infiniband"
SYSFS_ROOT_ENV = "TRAINING_EFA_SYSFS_ROOT"
# Where the node's counter server answers, as the worker pods are told it (`main`, `serve`).
COUNTERS_URL_ENV = "TRAINING_EFA_COUNTERS_URL"
# A counter file below the root: `<device>/ports/<port>/hw_counters/<name>`.
COUNTER_GLOB = "*/ports/*/hw_counters"
COUNTER_PATH = re.compile(r"([^/\s]+)/ports/(\d+)/hw_counters/(\w+)")
_LINE = re.compile(COUNTER_PATH.pattern + r" (\d+)")
# The counters read, by their driver names: bytes and packets through the port, by RDMA read (the
# port's own reads, and its answers to its peers' reads: rdma_read_resp_bytes) and write and by
# send/receive, and the signs of a sick fabric. Older drivers lack some (rdma_write_* came with newer
# devices); a missing file is simply not reported.
COUNTERS = (
    "tx_bytes",
    "rx_bytes",
    "tx_pkts",
    "rx_pkts",
    "send_bytes",
    "recv_bytes",
    "rdma_read_bytes",
    "rdma_read_resp_bytes",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "impaired_remote_conn_events",
    "unresponsive_remote_events",
)
# The port's bytes moved: sent and received, and by RDMA read and write. No source says whether the
# device's tx/rx_bytes already hold RDMA payload (the driver copies what the device's admin queue
# reports for each stats type, basic and RDMA apart: efa_verbs.c `efa_get_hw_stats`), so both are
# summed. A sum that counts RDMA bytes twice over-reads by at most 2x, which the gate's floor on
# bytes moved allows for (`workloads.training_run.verdicts.efa_counters`); one that left RDMA out
# could read 0 for a job that moved GiB by RDMA.
MOVED = (
    "tx_bytes",
    "rx_bytes",
    "rdma_read_bytes",
    "rdma_read_resp_bytes",
    "rdma_write_bytes",
    "rdma_write_recv_bytes",
)
URL_TIMEOUT_S = 2.0  # the counter server is on the pod's own node
# How long the counter server waits for a client's request line before dropping it: a GET from the
# same node arrives at once (CPython Lib/socketserver.py, `StreamRequestHandler.timeout`).
REQUEST_TIMEOUT_S = 2.0

# Counters of one node: `<device>/<port>` -> counter name -> value.
PortCounters = dict[str, dict[str, int]]


def sysfs_root(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(SYSFS_ROOT_ENV) or SYSFS_ROOT


def counters_source(environ: Mapping[str, str] = os.environ) -> str:
    """Where this process reads its node's counters: the node's counter server when the pod was
    told one, else the sysfs folder."""
    url = environ.get(COUNTERS_URL_ENV)
    return bracketed(url) if url else sysfs_root(environ)


def bracketed(url: str) -> str:
    """`url` with an IPv6 host in brackets (RFC 3986, 3.2.2): the kubelet puts the node's address
    into the worker pods' URL as it is, and on an IPv6 cluster that address holds colons."""
    scheme, separator, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    host, _, port = authority.rpartition(":")
    if separator and ":" in host and not host.startswith("["):
        return f"{scheme}://[{host}]:{port}{slash}{path}"
    return url


def port_name(device: str, port: str) -> str:
    return f"{device}/{port}"


def counter_lines(root: str) -> str:
    """`<device>/ports/<port>/hw_counters/<name> <value>` for each counter file under `root`."""
    lines = []
    for folder in sorted(Path(root).glob(COUNTER_GLOB)):
        for name in COUNTERS:
            try:
                value = int((folder / name).read_text().strip())
            except (OSError, ValueError):
                continue
            lines.append(f"{folder.parents[2].name}/ports/{folder.parent.name}/hw_counters/{name} {value}\n")
    return "".join(lines)


def parse_counters(text: str) -> PortCounters:
    """`counter_lines` output -> {`<device>/<port>`: {name: value}}; other lines are ignored."""
    found: PortCounters = {}
    for line in text.splitlines():
        if match := _LINE.fullmatch(line.strip()):
            device, port, name, value = match.groups()
            found.setdefault(port_name(device, port), {})[name] = int(value)
    return found


def read_counters(source: str) -> PortCounters:
    """A node's counters from a sysfs folder or a counter server's URL; empty where there are none
    (no such folder, a compat device without `hw_counters`, a server that does not answer)."""
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=URL_TIMEOUT_S) as reply:
                return parse_counters(reply.read().decode())
        except (OSError, ValueError):
            return {}
    return parse_counters(counter_lines(source))


def read_moved_bytes(source: str) -> dict[str, int]:
    """Bytes moved so far through each EFA port (`<device>/<port>`) of the node (`MOVED`)."""
    return {
        port: sum(counts[name] for name in MOVED if name in counts)
        for port, counts in read_counters(source).items()
        if any(name in counts for name in MOVED)
    }


class CounterServer(ThreadingHTTPServer):
    """A thread per connection, daemon threads (`ThreadingHTTPServer`'s own setting), so a client that
    connects and sends nothing holds only its own thread, and the server on either address family."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)


def counter_server(address: str, port: int, root: str = SYSFS_ROOT) -> CounterServer:
    """An HTTP server answering every GET with `counter_lines(root)`: the node's counter server, run
    by the reader DaemonSet in the host's network namespace on the node's own address (`main`, `serve`)."""

    class Counters(BaseHTTPRequestHandler):
        # A client silent this long is dropped (`readline` on its socket times out).
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            body = counter_lines(root).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """One line per request would be one per training step and node: none."""

    return CounterServer((address, port), Counters)


def main(argv: list[str]) -> None:
    """`print [ROOT]`: the counter lines once (the TrainingRun's exec); `serve ADDRESS PORT [ROOT]`."""
    if argv[:1] == ["print"]:
        sys.stdout.write(counter_lines(argv[1] if len(argv) > 1 else SYSFS_ROOT))
    elif argv[:1] == ["serve"] and len(argv) in (3, 4):
        counter_server(argv[1], int(argv[2]), argv[3] if len(argv) == 4 else SYSFS_ROOT).serve_forever()
    else:
        sys.exit("usage: efa_sysfs.py print [ROOT] | serve ADDRESS PORT [ROOT]")


if __name__ == "__main__":
    main(sys.argv[1:])
