"""What the names in NCCL's lines mean: a network plugin's family, a libfabric provider's transport.

Read by `workloads.nccl_transport`'s parser and judge; standard library only, as that module is.
"""

from __future__ import annotations


def network_family(name: str) -> str:
    """Map an NCCL net plugin name to `socket`, `ib`, `libfabric`, or the name itself."""
    lowered = name.strip().lower()
    if lowered == "socket":
        return "socket"
    if lowered.startswith("ib"):
        return "ib"
    if "libfabric" in lowered or lowered in {"ofi", "aws ofi"}:
        return "libfabric"
    return name.strip()


FAMILY_NAMES = {"socket": "Socket", "ib": "IB", "libfabric": "Libfabric"}
PROVIDER_NAMES = {"efa": "efa", "socket": "tcp/sockets", "ib": "verbs", "unknown": "unrecognised"}


def provider_transport(provider: str) -> str:
    """Map a libfabric provider name (`efa`, `efa-direct`, `tcp;ofi_rxm`, ...) to a transport."""
    lowered = provider.lower()
    if lowered.startswith("efa"):
        return "efa"
    if any(tcp in lowered for tcp in ("tcp", "sockets", "udp")):
        return "socket"
    if "verbs" in lowered:
        return "ib"
    return "unknown"
