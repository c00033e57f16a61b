"""A run's attempts in its storage folder: Ray Train's controller callback (`AttemptRecorder`), which
outlives the worker groups it restarts and records each fault and recovery
(`training.components.attempts`), the hang watchdog's note it reads, and the reads and clearing
of both by the driver and the restarted rank 0."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import pyarrow.fs
from ray.exceptions import RayActorError
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.config import RunConfig

from training.components.async_checkpoint import CHECKPOINT_STEP_KEY
from training.components.attempts import (
    ATTEMPTS_FILE,
    CAUSE_CHARS,
    WorkerError,
    dumps_record,
    fault_cause,
    loads_record,
    record_fault,
    record_recovery,
)
from training.components.watchdog import HANG_NOTE_FILE, hang_cause
from training.config.settings import NODE_NAME_ENV

# In each worker's reported metrics: its node, so the controller can name the node of a worker that
# fails (and a restart refuse a second fault in a row there).
HOST_KEY = "host"
# The cause of a restart no error of the worker group reached the controller's callback for.
RESTARTED_WITHOUT_ERROR = (
    "Ray Train restarted the worker group without a worker's error (a node's drain or preemption)"
)


def worker_node() -> str:
    """The node this worker runs on: the Kubernetes node its pod was given (`NODE_NAME_ENV`), else
    (`--local`, a bare Ray cluster) the machine's hostname."""
    return os.environ.get(NODE_NAME_ENV) or socket.gethostname()


def _attempts_path(run_path: str) -> str:
    return f"{run_path.rstrip('/')}/{ATTEMPTS_FILE}"


def read_attempts(filesystem: pyarrow.fs.FileSystem, run_path: str) -> list[dict[str, Any]]:
    """The run's stored attempts ([] before its first fault)."""
    path = _attempts_path(run_path)
    if filesystem.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return []
    with filesystem.open_input_stream(path) as stream:
        return loads_record(stream.read())


def worker_error(rank: int, error: BaseException) -> WorkerError:
    """A worker's error as Ray Train's poll reports it: a worker whose actor died comes wrapped in
    the health check's error (ray/train/v2/_internal/exceptions.py, WorkerHealthCheckFailedError)."""
    error = getattr(error, "health_check_failure", None) or error
    return WorkerError(rank, isinstance(error, RayActorError), type(error).__name__, str(error))


class AttemptRecorder(UserCallback):
    """On Ray Train's controller, which outlives the worker groups it restarts: each fault of the
    run written to its storage folder for the restarted rank 0 (`training.components.attempts`),
    and the attempt's recovery once its first step is reported (ray/train/v2/api/callback.py)."""

    def __init__(self) -> None:
        self.record: list[dict[str, Any]] = []
        self.last_step = 0  # every worker reported it: the last step finished
        self.checkpoint_step = 0  # the latest checkpoint's, which a restart resumes from
        self.hosts: dict[int, str] = {}
        self.starts = 0  # worker groups started (`AttemptBoundary`)
        self.faulted = False  # this worker group's fault is recorded: later polls of it add none

    def _write(self, run_context: Any) -> None:
        storage = run_context.run_config.storage_context
        with storage.storage_filesystem.open_output_stream(_attempts_path(storage.experiment_fs_path)) as out:
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
        cause, node = fault_cause(errors, self.hosts)
        if (note := _take_hang_note(run_context)) is not None and note.get(
            "attempt", self.starts
        ) == self.starts:
            cause, node = hang_cause(note, self.hosts, CAUSE_CHARS)
        self._record(run_context, cause, node)

    def worker_group_started(self, run_context: Any) -> None:
        """A worker group started (`AttemptBoundary`): a later one is a restart, recorded even where
        Ray made it without an error reaching this callback (a preemption's restart)."""
        self.starts += 1
        if self.starts > 1 and not self.faulted:
            self._record(run_context, RESTARTED_WITHOUT_ERROR, None)
        self.faulted = False

    def _record(self, run_context: Any, cause: str, node: str | None) -> None:
        self.faulted = True
        self.record = record_fault(
            self.record,
            cause=cause,
            node=node,
            failed_after_step=self.last_step,
            resumed_from_step=self.checkpoint_step,
            detected_at=time.time(),
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


def _hang_note_path(run_path: str) -> str:
    return f"{run_path.rstrip('/')}/{HANG_NOTE_FILE}"


def _take_hang_note(run_context: Any) -> dict[str, Any] | None:
    """The hang watchdog's note of the attempt that failed (`RaySession.note_hang`), removed as read."""
    storage = run_context.run_config.storage_context
    path, filesystem = _hang_note_path(storage.experiment_fs_path), storage.storage_filesystem
    if filesystem.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as stream:
        note: dict[str, Any] = json.loads(stream.read())
    filesystem.delete_file(path)
    return note


def clear_attempts(run_config: RunConfig) -> None:
    """A run starts with no attempts: a record left by an earlier run of this --run-name (which
    failed, and which this one resumes) is not this run's."""
    storage = run_config.storage_context
    for path in (_attempts_path(storage.experiment_fs_path), _hang_note_path(storage.experiment_fs_path)):
        if storage.storage_filesystem.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
            storage.storage_filesystem.delete_file(path)
