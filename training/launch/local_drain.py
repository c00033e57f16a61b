"""`--local`: a SIGTERM to the driver drains the embedded Ray node as `ray start --block` drains a
KubeRay pod's node on an eviction, then waits for the checkpoint that the drain brings.

Ray 2.58's `ray start --block` answers SIGTERM by marking its node draining with reason
PREEMPTION and a deadline of RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (30 s by default) through the
GCS's DrainNode call (ray/_private/node.py `_drain_node_before_shutdown`; `ray drain-node` makes
the same call, ray/scripts/scripts.py). Ray Train's PreemptionWatcher then hands every worker the
notice (`ray.train.get_preemption_info`), the workers checkpoint the step they are in
(`training.components.drain`), and the controller commits it to the run's
checkpoint_manager_snapshot.json. This handler makes the same call for the embedded node, waits
until the snapshot's latest checkpoint is a new one (or the grace runs out), and exits with one line
that names the step committed and how to resume.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable

import pyarrow.fs
import ray
from ray._private import ray_constants
from ray.core.generated import autoscaler_pb2

from training.components.drain import DRAINED_EXIT_CODE

# Ray Train V2 keeps its checkpoint manager's state here, under the run's folder
# (ray 2.58: ray/train/v2/_internal/constants.py CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"
POLL_S = 0.2
_STEP = re.compile(r"checkpoint_(\d+)$")


def committed_checkpoint(snapshot: str | None) -> str | None:
    """The latest checkpoint's folder name in a checkpoint manager snapshot's JSON (None: none)."""
    if not snapshot:
        return None
    latest = json.loads(snapshot).get("latest_checkpoint_result")
    return None if latest is None else str(latest["checkpoint_dir_name"])


def checkpoint_step(name: str) -> int | None:
    match = _STEP.search(name)
    return int(match.group(1)) if match else None


def drained_line(run_dir: str, run_name: str, before: str | None, after: str | None, waited_s: float) -> str:
    """The driver's last line after a drain: the step committed since the SIGTERM, or none."""
    resume = f"`python -m training --local --run-name {run_name}` with the same flags resumes"
    if after is None or after == before:
        latest = "no checkpoint" if after is None else f"step {checkpoint_step(after)}"
        return (
            f"SIGTERM: no checkpoint committed within {waited_s:.1f} s of the drain; the latest is "
            f"{latest}: {resume} from it"
        )
    return (
        f"SIGTERM: checkpoint of step {checkpoint_step(after)} committed ({run_dir}/{after}) "
        f"{waited_s:.1f} s after the drain began; {resume} from it"
    )


def _reader(run_dir: str) -> Callable[[], str | None]:
    filesystem, path = pyarrow.fs.FileSystem.from_uri(run_dir)

    def read() -> str | None:
        try:
            with filesystem.open_input_stream(f"{path}/{SNAPSHOT_FILE}") as stream:
                return committed_checkpoint(stream.read().decode())
        except (FileNotFoundError, OSError, ValueError):
            return None

    return read


def drain_embedded_node(deadline_s: float) -> None:
    """Mark this driver's embedded node draining for a preemption, its deadline `deadline_s` away:
    the GCS call `ray start --block` makes on SIGTERM."""
    node = ray._private.worker.global_worker.node
    assert node is not None, "ray.init() runs the embedded node first"
    deadline_ms = int((time.time() + deadline_s) * 1000)
    node.get_gcs_client().drain_node(
        ray.get_runtime_context().get_node_id(),
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,  # type: ignore[attr-defined]
        "python -m training --local received SIGTERM",
        deadline_ms,
        timeout=deadline_s,
    )


def install(run_dir: str, run_name: str) -> None:
    """In the driver's main thread, once the embedded Ray runs."""
    read = _reader(run_dir)
    grace = ray_constants.RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one drain
        started = time.monotonic()
        before = read()
        drain_embedded_node(grace)
        after = before
        # Leave a second of the grace for the line and the exit.
        while time.monotonic() - started < grace - 1 and (after := read()) == before:
            time.sleep(POLL_S)
        print(drained_line(run_dir, run_name, before, after, time.monotonic() - started), flush=True)
        sys.stderr.flush()
        os._exit(DRAINED_EXIT_CODE)

    signal.signal(signal.SIGTERM, on_sigterm)
