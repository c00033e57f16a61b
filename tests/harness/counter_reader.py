"""The EFA counter reader's server as a node runs it: the kubelet's expansion of a container's
variables and command, and the reader DaemonSet's command, so expanded, run as a real process here.

The expansion follows Kubernetes' rules (k8s.io/kubernetes third_party/forked/golang/expansion/expand.go,
applied by pkg/kubelet/kubelet_pods.go to each variable's value and by
pkg/kubelet/container/helpers.go to the command and args): `$(NAME)` becomes the variable's value
when the container defines NAME and stays as written when it does not, `$$` becomes `$`, and any
other `$` (`$(` without a closing parenthesis, `$NAME`, `${NAME}`, a last `$`) stays as written.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from workloads.efa_counter_reader import reader_daemonset

START_TIMEOUT_S = 30
IMAGE = "763104351884.dkr.ecr.us-east-2.amazonaws.com/ray:2.58.0-gpu"


def kubelet_expand(text: str, env: Mapping[str, str]) -> str:
    """`text` with the variable references the kubelet replaces, replaced (module doc)."""
    out, at = [], 0
    while at < len(text):
        if text[at] != "$" or at + 1 == len(text):
            out.append(text[at])
            at += 1
        elif text[at + 1] == "$":
            out.append("$")
            at += 2
        elif text[at + 1] == "(" and (close := text.find(")", at + 2)) != -1:
            name = text[at + 2 : close]
            out.append(env.get(name, f"$({name})"))
            at = close + 1
        else:
            out.append(text[at : at + 2])
            at += 2
    return "".join(out)


def kubelet_env(env: list[dict], fields: Mapping[str, str]) -> dict[str, str]:
    """A container's variables as the kubelet sets them: a `fieldRef` read from the pod's fields
    (`status.hostIP`, ...), a `value` expanded over the variables listed before it."""
    resolved: dict[str, str] = {}
    for variable in env:
        if "valueFrom" in variable:
            resolved[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            resolved[variable["name"]] = kubelet_expand(variable.get("value", ""), resolved)
    return resolved


def reader_container() -> dict:
    (container,) = reader_daemonset(IMAGE)["spec"]["template"]["spec"]["containers"]
    return container


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def has_ipv6_loopback() -> bool:
    try:
        free_port("::1")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class ServedReader:
    host: str
    port: int

    @property
    def url(self) -> str:
        """As the kubelet writes a worker pod's `TRAINING_EFA_COUNTERS_URL`: the address as it is."""
        return f"http://{self.host}:{self.port}/"


@contextlib.contextmanager
def running_reader(root: Path, host: str) -> Iterator[ServedReader]:
    """The reader DaemonSet's command, expanded by the kubelet's rules on a node whose address is
    `host`, on a free port and over the sysfs folder `root`; killed when the block ends, whatever
    happens in it."""
    container = reader_container()
    env = kubelet_env(container["env"], {"status.hostIP": host})
    command = [kubelet_expand(arg, env) for arg in container["command"]]
    port = free_port(host)
    with tempfile.TemporaryFile() as stderr:
        server = subprocess.Popen(
            [sys.executable, *command[1:5], str(port), str(root)], stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    socket.create_connection((host, port), timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        stderr.seek(0)
                        raise AssertionError(f"the reader did not serve: {stderr.read().decode()}") from None
                    time.sleep(0.05)
            yield ServedReader(host, port)
        finally:
            server.kill()
            server.wait(timeout=10)
