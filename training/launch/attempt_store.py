"""A run's attempts in its storage folder: Ray Train's controller callback (`AttemptRecorder`), which
outlives the worker groups it restarts and records each fault and recovery
(`training.components.attempts`), the hang watchdog's note it reads, and the reads and clearing
of both by the driver and the restarted rank 0."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs
import ray
from ray.exceptions import RayActorError
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.config import RunConfig

from training.components.async_checkpoint import CHECKPOINT_STEP_KEY
from training.components.attempts import (
    ATTEMPTS_FILE,
    CAUSE_CHARS,
    WorkerError,
    awaits_node_deaths,
    dumps_record,
    fault_cause,
    loads_record,
    record_fault,
    record_recovery,
)
from training.components.watchdog import HANG_NOTE_FILE, hang_cause

# In each worker's reported metrics: its node, so the controller can name the node of a worker that
# fails (and a restart refuse a second fault in a row there).
HOST_KEY = "host"
# Each attempt's nodes by rank, Kubernetes' and Ray's, written by its rank 0 at its start
# (`write_attempt_nodes`): the controller names a fault's node from the attempt it happened in.
ATTEMPT_NODES_FILE = "nodes.json"
# How long the controller waits for Ray's GCS to declare a silent node dead before it judges deaths
# confined to another node (`awaits_node_deaths`): above the GCS's ~15 s to miss a raylet's health
# checks, within a restart's minutes.
NODE_DEATH_SETTLE_S = 30.0
# The cause of a restart no error of the worker group reached the controller's callback for.
RESTARTED_WITHOUT_ERROR = (
    "Ray Train restarted the worker group without a worker's error (a node's drain or preemption)"
)


def in_run(run_path: str, name: str) -> str:
    """The path of the file `name` in the run's folder."""
    return f"{run_path.rstrip('/')}/{name}"


def _read(filesystem: pyarrow.fs.FileSystem, path: str) -> bytes | None:
    """The file's bytes; None where it is not there."""
    if filesystem.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as stream:
        data: bytes = stream.read()
    return data


def read_attempts(filesystem: pyarrow.fs.FileSystem, run_path: str) -> list[dict[str, Any]]:
    """The run's stored attempts ([] before its first fault)."""
    data = _read(filesystem, in_run(run_path, ATTEMPTS_FILE))
    return [] if data is None else loads_record(data)


def worker_error(rank: int, error: BaseException) -> WorkerError:
    """A worker's error as Ray Train's poll reports it: a worker whose actor died comes wrapped in
    the health check's error (ray/train/v2/_internal/exceptions.py, WorkerHealthCheckFailedError);
    its node's drain sets `preempted` (ray/exceptions.py, ActorDiedError: AUTOSCALER_DRAIN_PREEMPTED)."""
    error = getattr(error, "health_check_failure", None) or error
    died = isinstance(error, RayActorError)
    preempted = died and bool(getattr(error, "preempted", False))
    return WorkerError(rank, died, type(error).__name__, str(error), preempted=preempted)


def write_attempt_nodes(
    filesystem: pyarrow.fs.FileSystem, run_path: str, attempt: int, nodes: list[str], ray_nodes: list[str]
) -> None:
    """Rank 0's record of its attempt's nodes by rank: Kubernetes node names and Ray node ids."""
    payload = {"attempt": attempt, "nodes": nodes, "ray_nodes": ray_nodes}
    with filesystem.open_output_stream(in_run(run_path, ATTEMPT_NODES_FILE)) as out:
        out.write(json.dumps(payload).encode())


def read_attempt_nodes(filesystem: pyarrow.fs.FileSystem, run_path: str) -> dict[str, Any] | None:
    """The latest attempt's nodes as its rank 0 wrote them; None before any."""
    data = _read(filesystem, in_run(run_path, ATTEMPT_NODES_FILE))
    nodes: dict[str, Any] | None = None if data is None else json.loads(data)
    return nodes


def alive_ray_nodes() -> set[str]:
    """The ids of the nodes Ray's GCS holds alive (`ray.nodes()`, from the controller)."""
    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


class AttemptRecorder(UserCallback):
    """On Ray Train's controller, which outlives the worker groups it restarts: each fault of the
    run written to its storage folder for the restarted rank 0 (`training.components.attempts`),
    and the attempt's recovery once its first step is reported (ray/train/v2/api/callback.py)."""

    def __init__(
        self,
        alive: Callable[[], set[str]] = alive_ray_nodes,
        settle_s: float = NODE_DEATH_SETTLE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.alive, self.settle_s, self.sleep = alive, settle_s, sleep
        self.record: list[dict[str, Any]] = []
        self.last_step = 0  # every worker reported it: the last step finished
        self.checkpoint_step = 0  # the latest checkpoint's, which a restart resumes from
        self.hosts: dict[int, str] = {}
        self.starts = 0  # worker groups started (`AttemptBoundary`)
        self.faulted = False  # this worker group's fault is recorded: later polls of it add none

    def _write(self, run_context: Any) -> None:
        storage = run_context.run_config.storage_context
        with storage.storage_filesystem.open_output_stream(
            in_run(storage.experiment_fs_path, ATTEMPTS_FILE)
        ) as out:
            out.write(dumps_record(self.record))

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        step = int(metrics[0].get("step", self.last_step))
        # Every report names its rank's host but a checkpoint's commit may not: keep the last known.
        self.hosts.update(
            {rank: reported[HOST_KEY] for rank, reported in enumerate(metrics) if HOST_KEY in reported}
        )
        if self.record and self.record[-1]["recovery_s"] is None:
            self.record = record_recovery(self.record, first_step=step, at=time.time())
            self._write(run_context)
        self.last_step = step
        if checkpoint is not None:
            # A checkpoint committed behind the steps holds an earlier step than the report's.
            self.checkpoint_step = int(metrics[0].get(CHECKPOINT_STEP_KEY, step))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        """Called on every poll of the worker group while its errors stand (ray 2.58:
        ray/train/v2/_internal/callbacks/user_callback.py, `after_worker_group_poll_status`): a
        drain's preempting state polls for as long as it lasts. One record a worker group."""
        if self.faulted:
            return
        errors = [worker_error(rank, error) for rank, error in sorted(worker_exceptions.items())]
        hosts, lost = self._attempt_hosts(run_context, errors)
        cause, node = fault_cause(errors, hosts, lost)
        if (note := _take_hang_note(run_context)) is not None and note.get(
            "attempt", self.starts
        ) == self.starts:
            cause, node = hang_cause(note, hosts, CAUSE_CHARS)
        self._record(run_context, cause, node, drained=any(error.preempted for error in errors))

    def _attempt_hosts(self, run_context: Any, errors: list[WorkerError]) -> tuple[dict[int, str], set[str]]:
        """This worker group's ranks' nodes (as its rank 0 wrote them, else as reports named them),
        and those of its nodes Ray's GCS holds dead; where deaths on one node could be a silent
        node's loss not yet declared, its declaration is waited for (`NODE_DEATH_SETTLE_S`)."""
        storage = run_context.run_config.storage_context
        written = read_attempt_nodes(storage.storage_filesystem, storage.experiment_fs_path)
        if written is None or written.get("attempt") != self.starts:
            return dict(self.hosts), set()
        hosts = dict(enumerate(written["nodes"]))
        ray_nodes: list[str] = written["ray_nodes"]
        waited = 0.0
        while True:
            alive = self.alive()
            lost = {hosts[rank] for rank, ray_node in enumerate(ray_nodes) if ray_node not in alive}
            if lost or waited >= self.settle_s or not awaits_node_deaths(errors, hosts):
                return hosts, lost
            self.sleep(1.0)
            waited += 1.0

    def worker_group_started(self, run_context: Any) -> None:
        """A worker group started (`AttemptBoundary`): a later one is a restart, recorded even where
        Ray made it without an error reaching this callback (a preemption's restart)."""
        self.starts += 1
        if self.starts > 1 and not self.faulted:
            self._record(run_context, RESTARTED_WITHOUT_ERROR, None, drained=True)
        self.faulted = False

    def _record(self, run_context: Any, cause: str, node: str | None, *, drained: bool) -> None:
        self.faulted = True
        self.record = record_fault(
            self.record,
            cause=cause,
            node=node,
            failed_after_step=self.last_step,
            resumed_from_step=self.checkpoint_step,
            detected_at=time.time(),
            drained=drained,
        )
        # The restart starts from the checkpoint: until it reports, that is the last step finished.
        self.last_step = self.checkpoint_step
        self._write(run_context)


class AttemptBoundary(WorkerGroupCallback):
    """Tells the recorder each worker group's start: a `UserCallback` hears only reports and errors,
    and Ray Train runs callbacks of its internal kinds as given (ray 2.58:
    ray/train/v2/api/data_parallel_trainer.py keeps every run-config callback that is not a
    `UserCallback` among the controller's; `WorkerGroupCallback.after_worker_group_start`). Pickled
    to the controller with the recorder in one list, it holds the same recorder there."""

    def __init__(self, recorder: AttemptRecorder) -> None:
        self.recorder = recorder

    def after_worker_group_start(self, worker_group: Any) -> None:
        # The run's context as the worker group holds it (ray 2.58: WorkerGroup._train_run_context).
        self.recorder.worker_group_started(worker_group._train_run_context)


def _take_hang_note(run_context: Any) -> dict[str, Any] | None:
    """The hang watchdog's note of the attempt that failed (`RaySession.note_hang`), removed as read."""
    storage = run_context.run_config.storage_context
    path, filesystem = in_run(storage.experiment_fs_path, HANG_NOTE_FILE), storage.storage_filesystem
    data = _read(filesystem, path)
    if data is None:
        return None
    filesystem.delete_file(path)
    note: dict[str, Any] = json.loads(data)
    return note


def clear_attempts(run_config: RunConfig) -> None:
    """A run starts with no attempts: a record left by an earlier run of this --run-name (which
    failed, and which this one resumes) is not this run's."""
    storage = run_config.storage_context
    run_path = storage.experiment_fs_path
    for path in (in_run(run_path, name) for name in (ATTEMPTS_FILE, HANG_NOTE_FILE, ATTEMPT_NODES_FILE)):
        if storage.storage_filesystem.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
            storage.storage_filesystem.delete_file(path)
