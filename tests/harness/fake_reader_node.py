"""One GPU node's EFA counter reader container as the kubelet runs it: the real program on a free
port over a `FakeEfaSysfs` tree, Ready when it answers its probe."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from tests.harness.counter_reader import free_port, kubelet_env, kubelet_expand, reader_container
from workloads.efa_counter_reader import READER_CONTAINER, READER_PORT


class FakeReaderNode:
    """One GPU node's EFA counter reader container, as the kubelet runs it and sees it.

    - It runs the real program: the reader DaemonSet's own container command (`reader_daemonset`),
      `$(NODE_IP)` expanded by the kubelet's rules (`counter_reader.kubelet_expand`) to 127.0.0.1, which stands in
      for the node's address, the port swapped for a free one (every fake node shares this
      machine) and the node's sysfs (`root`: a `FakeEfaSysfs` host view) appended as the sysfs
      root; `python` is the image's interpreter.
    - Ready is what the kubelet's readiness probe finds: an HTTP GET on the port answered 2xx
      within `timeoutSeconds`, 1 s by default (Kubernetes docs, "Configure Liveness, Readiness and
      Startup Probes"). A container whose program cannot start (`python` None: an image without
      one) or has died is not running: the pod shows CrashLoopBackOff, never Ready, and an exec
      into it is refused (`FakeKubeApi._exec`).

    `replaced` says when the container is down for a while, as during a DaemonSet rollout, which
    replaces a node's reader pod whenever its command or image changes (Kubernetes docs, "Perform a
    Rolling Update on a DaemonSet": the old pod is deleted before the new one starts).

    The container starts when the kubelet is first asked about it, so a test that never lists the
    readers starts no process; `stop_all` (an autouse fixture of tests/conftest.py) ends every one
    after each test.
    """

    PROBE_TIMEOUT_S = 1.0
    _started: ClassVar[list[FakeReaderNode]] = []

    def __init__(self, root: Path, python: str | None = sys.executable):
        self.root = root
        self.python = python
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.stopped = False
        self.replaced: Callable[[], bool] = lambda: False

    @classmethod
    def stop_all(cls) -> None:
        for reader in cls._started:
            reader.stop()
        cls._started.clear()

    def _start(self) -> None:
        if self.python is None or self.process is not None or self.stopped:
            return
        self._started.append(self)
        container = reader_container()
        env = kubelet_env(container["env"], {"status.hostIP": "127.0.0.1"})
        argv = [kubelet_expand(arg, env) for arg in container["command"]]
        self.port = free_port("127.0.0.1")
        argv = [str(self.port) if arg == str(READER_PORT) else arg for arg in argv]
        self.process = subprocess.Popen(
            [self.python, *argv[1:], str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10  # the interpreter's start, then the server's bind
        while self.process.poll() is None and not self._answers() and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        """The container dies and stays down (no restart is modelled)."""
        self.stopped = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        self._start()
        return self.process is not None and self.process.poll() is None and not self.replaced()

    def ready(self) -> bool:
        return self.running and self._answers()

    def _answers(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/"
            with urllib.request.urlopen(url, timeout=self.PROBE_TIMEOUT_S) as reply:
                return 200 <= reply.status < 300
        except OSError:
            return False

    def pod_status(self) -> dict:
        ready = self.ready()
        running = self.running
        state = {"running": {}} if running else {"waiting": {"reason": "CrashLoopBackOff"}}
        return {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": READER_CONTAINER,
                    "image": "ray",
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0 if running else 5,
                    "state": state,
                }
            ],
        }
