"""One real Ray head for the whole test session, started on first use: `ray start --head`, the
way a RayCluster's head pod starts Ray (KubeRay runs `ray start --head --block` in it), with its
own ports and temp dir, and the job dashboard on.

Tests that need a Ray cluster but not an embedded one share it: Ray Data on the driver, the
TrainingRun's job submission, and training or fabric-probe runs that join it through RAY_ADDRESS,
the path a job takes on the cluster. Each such run is a Ray job of its own: Ray gives it fresh
worker processes and frees its actors and placement groups when its driver exits
(https://docs.ray.io/en/latest/ray-core/fault_tolerance/actors.html: non-detached actors end
with their job), so runs sharing the head do not see each other's workers. What the head saves
is its own start (GCS, raylet, dashboard and agents: about 8 s on a 2-core machine) per run.
`--local` keeps its own tests (the README's main job, the embedded run's messages).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60
CPUS = 3  # two CPU workers and one for Ray Data's tasks, as `--local` sizes its embedded Ray


@dataclass(frozen=True)
class RayHead:
    address: str  # host:port of the GCS, what RAY_ADDRESS names
    dashboard: str  # the job API
    session_logs: Path
    env: dict[str, str]  # the head's environment, RAY_ADDRESS naming the head
    root: Path  # a folder of the head's own, for the files a test writes beside it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return children


def _process_tree(root: int) -> set[int]:
    children, tree, todo = _children(), set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def stop_process_tree(process: subprocess.Popen) -> None:
    """Stop exactly the processes this head started: freeze the tree (nothing new can fork), then
    kill it. Not `ray stop`: that kills every Ray process of the user on the machine, other test
    runs' included."""
    frozen: set[int] = set()
    while new := _process_tree(process.pid) - frozen:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


@contextlib.contextmanager
def running_head() -> Iterator[RayHead]:
    root = Path(tempfile.mkdtemp(prefix="ray-head-"))  # short: Ray's unix sockets live under it
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port, dashboard_port = free_port(), free_port()
    # As KubeRay sets it in every pod of a RayCluster (KubeRay's "Network-related environment
    # variables": RAY_ADDRESS, kuberay pull 388). Every process of the head inherits it, Ray
    # Train's placement-group cleaner too, which looks its cluster up without an address and so
    # finds this head rather than failing on "multiple active Ray instances" beside another Ray.
    env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    command = [
        "ray", "start", "--head", "--block",
        f"--num-cpus={CPUS}",
        "--include-dashboard=true",
        f"--dashboard-port={dashboard_port}",
        f"--port={port}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--temp-dir={root / 'ray'}",
        "--disable-usage-stats",
    ]  # fmt: skip
    with open(root / "ray-start.log", "w") as start_log:
        # Its workers start in the head's folder, not the tests' working directory: a relative
        # path a driver forgot to make absolute names nothing there, as on a cluster.
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=start_log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        dashboard = f"http://127.0.0.1:{dashboard_port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{dashboard}/api/version", timeout=2).close()
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the local Ray head did not start:\n" + (root / "ray-start.log").read_text()[-3000:]
                )
            time.sleep(0.5)
        yield RayHead(env["RAY_ADDRESS"], dashboard, root / "ray" / "session_latest" / "logs", env, root)
    finally:
        stop_process_tree(process)
        shutil.rmtree(root, ignore_errors=True)
