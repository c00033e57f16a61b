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

`running_head(token=...)` starts a head of its own with Ray's token authentication on, as the
RayCluster's pods run (`token_auth_env`): the session's head runs without it, since the tests that
drive Ray in their own process (Ray Data on the driver) would need the token in theirs.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60
CPUS = 3  # two CPU workers and one for Ray Data's tasks, as `--local` sizes its embedded Ray


@dataclass(frozen=True)
class RayHead:
    address: str  # host:port of the GCS, what RAY_ADDRESS names
    dashboard: str  # the job API
    session_logs: Path
    env: dict[str, str]  # the head's environment, RAY_ADDRESS naming the head (and the token, with one)
    root: Path  # a folder of the head's own, for the files a test writes beside it


def token_auth_env(token: str) -> dict[str, str]:
    """What KubeRay 1.7.0 sets in each Ray container of a RayCluster with `authOptions: {mode: token}`
    (ray-operator/controllers/ray/common/pod.go, `SetContainerTokenAuthEnvVars`): RAY_AUTH_MODE, and
    RAY_AUTH_TOKEN from its Secret. Ray reads both from the environment of every process: its
    servers check the token, its clients (`ray job submit`, the SDK) send it only in token mode
    (ray/_private/authentication/http_token_authentication.py, `get_auth_headers_if_auth_enabled`).
    Imported here, not above: the session's head (no token) needs none of the program's modules."""
    from workloads import manifests
    from workloads.training_run.access.head_jobs_api import TOKEN_ENV

    return {"RAY_AUTH_MODE": manifests.RAY_AUTH_OPTIONS["mode"], TOKEN_ENV: token}


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
def running_head(token: str | None = None, num_cpus: int = CPUS) -> Iterator[RayHead]:
    """A head with token authentication when given a token: always given, never Ray's own, which it
    would generate into ~/.ray/auth_token (ray/_private/authentication/authentication_token_setup.py).
    `num_cpus` 0: a head that runs drivers and no training worker, as the RayCluster's (`num-gpus: 0`)."""
    root = Path(tempfile.mkdtemp(prefix="ray-head-"))  # short: Ray's unix sockets live under it
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(token_auth_env(token) if token else {}),
    }
    port, dashboard_port = free_port(), free_port()
    # As KubeRay sets it in every pod of a RayCluster (KubeRay's "Network-related environment
    # variables": RAY_ADDRESS, kuberay pull 388). Every process of the head inherits it, Ray
    # Train's placement-group cleaner too, which looks its cluster up without an address and so
    # finds this head rather than failing on "multiple active Ray instances" beside another Ray.
    env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    command = [
        "ray", "start", "--head", "--block",
        f"--num-cpus={num_cpus}",
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
        version = urllib.request.Request(
            f"{dashboard}/api/version", headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(version, timeout=2).close()
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


@contextlib.contextmanager
def worker_node(
    head: RayHead, num_cpus: int, env: Mapping[str, str] | None = None, ip: str | None = None
) -> Iterator[subprocess.Popen]:
    """A second raylet joined to `head`, as a KubeRay worker pod is a Ray node of its own: `ray start
    --address=<head> --block`, PID 1 of the pod, with `env` as the pod's own variables (those the
    RayCluster sets from the downward API, say) and `ip` as its own address (a loopback one, as
    127.0.0.2: each pod has its address, and Ray Train counts a node's workers by it). Leaving the
    block stops it as a deleted pod whose node is gone (its whole process tree killed); a test may
    stop it sooner with `stop_process_tree`."""
    command = [
        "ray", "start", "--block",
        f"--address={head.address}",
        f"--num-cpus={num_cpus}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        "--disable-usage-stats",
        *([f"--node-ip-address={ip}"] if ip else []),
    ]  # fmt: skip
    log = head.root / f"worker-node-{free_port()}.log"
    with open(log, "w") as start_log:
        process = subprocess.Popen(
            command,
            cwd=head.root,
            env={**head.env, **(env or {})},
            stdout=start_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Ready once `ray start` says the node runs (ray/scripts/scripts.py prints it after the
        # raylet registered): two raylets starting at once on one machine can leave one unregistered.
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            stop_process_tree(process)
