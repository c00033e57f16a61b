"""NCCL_DEBUG=INFO lines as NCCL 2.2x and aws-ofi-nccl print them (`<host>:<pid>:<tid> [<dev>] NCCL INFO
...`), shared by the transport verdict's tests and the log reader's."""

from __future__ import annotations

from pathlib import Path

ORIGIN_A = "ip-10-0-1-23:4711:4790 [0]"
ORIGIN_B = "ip-10-0-1-87:5022:5075 [0]"
EFA_PROVIDER = "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"
SEND_LIBFABRIC = "Channel 00/0 : 3[3] -> 4[0] [send] via NET/Libfabric/0"
RECEIVE_LIBFABRIC = "Channel 00/0 : 3[3] -> 4[0] [receive] via NET/Libfabric/0"
SEND_SOCKET = "Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0"
RECEIVE_SOCKET = "Channel 00/0 : 3[3] -> 4[0] [receive] via NET/Socket/0"


def info(origin: str, message: str) -> str:
    return f"{origin} NCCL INFO {message}"


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
