"""A run's attempts in its storage folder (training/launch/attempt_store.py): a worker's error as Ray
Train's poll reports it, and the controller's callback writing what the restarted rank 0 reads."""

from __future__ import annotations

import json
import types

import pyarrow.fs
from ray.exceptions import RayActorError
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
from ray.train.v2.api.config import RunConfig

from tests.harness.ray_faults import DEATH, HOSTS, NODE_DIED, PROCESS_DIED, actor_death
from training.components.async_checkpoint import CHECKPOINT_STEP_KEY
from training.components.watchdog import HANG_NOTE_FILE
from training.launch.attempt_store import (
    HOST_KEY,
    RESTARTED_WITHOUT_ERROR,
    AttemptBoundary,
    AttemptRecorder,
    read_attempts,
    worker_error,
    write_attempt_nodes,
)


def test_a_dead_worker_comes_out_of_ray_trains_health_check_error():
    died = worker_error(
        1, WorkerHealthCheckFailedError("health check failed", RayActorError(error_msg=DEATH))
    )
    assert (died.rank, died.died, died.kind) == (1, True, "RayActorError") and DEATH in died.message
    raised = worker_error(0, RuntimeError("NCCL error"))
    assert (raised.died, raised.kind, raised.message) == (False, "RuntimeError", "NCCL error")


def test_the_controllers_callback_writes_what_the_restarted_rank_0_reads(tmp_path):
    """Ray Train calls the callback on its controller (ray/train/v2/api/callback.py) with a
    TrainRunContext whose run_config is the driver's RunConfig (ray/train/v2/_internal/execution/
    context.py); here a real RunConfig on a local folder, as a run's storage."""
    run_config = RunConfig(name="run", storage_path=str(tmp_path))
    context = types.SimpleNamespace(run_config=run_config)
    recorder = AttemptRecorder()
    reported = [{"step": 0, HOST_KEY: HOSTS[0]}, {"step": 0, HOST_KEY: HOSTS[1]}]
    for step in (1, 2, 3):
        metrics = [{**entry, "step": step} for entry in reported]
        recorder.after_report(context, metrics, checkpoint=object() if step == 2 else None)
    recorder.after_exception(context, {1: WorkerHealthCheckFailedError("x", RayActorError(error_msg=DEATH))})
    filesystem = pyarrow.fs.LocalFileSystem()
    [stored] = read_attempts(filesystem, str(tmp_path / "run"))
    assert (stored["node"], stored["failed_after_step"], stored["resumed_from_step"]) == (HOSTS[1], 3, 2)
    assert stored["recovery_s"] is None
    recorder.after_report(context, [{"step": 3, HOST_KEY: HOSTS[0]}, {"step": 3, HOST_KEY: HOSTS[1]}], None)
    [recovered] = read_attempts(filesystem, str(tmp_path / "run"))
    assert recovered["resumed_from_step"] == 2 and recovered["recovery_s"] >= 0
    assert read_attempts(filesystem, str(tmp_path / "other")) == []


def test_a_checkpoint_committed_behind_the_steps_is_recorded_at_the_step_it_holds(tmp_path):
    """The commit of step 5's checkpoint rides on step 7's report, naming step 5 (`checkpoint_step`): a
    fault after it resumes from step 5, not 7."""
    context = types.SimpleNamespace(run_config=RunConfig(name="run", storage_path=str(tmp_path)))
    recorder = AttemptRecorder()
    for step in range(1, 9):
        committed = {CHECKPOINT_STEP_KEY: 5} if step == 7 else {}
        metrics = [{"step": step, HOST_KEY: host, **committed} for host in HOSTS.values()]
        recorder.after_report(context, metrics, checkpoint=object() if step == 7 else None)
    recorder.after_exception(context, {1: WorkerHealthCheckFailedError("x", RayActorError(error_msg=DEATH))})
    [stored] = read_attempts(pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert (stored["failed_after_step"], stored["resumed_from_step"], stored["lost_steps"]) == (8, 5, 3)


def _started(recorder: AttemptRecorder, context: types.SimpleNamespace) -> None:
    """A worker group's start as Ray Train's controller tells its worker-group callbacks: the group holds
    the run's context (ray 2.58: WorkerGroup._train_run_context)."""
    AttemptBoundary(recorder).after_worker_group_start(types.SimpleNamespace(_train_run_context=context))


def test_a_drain_polled_forty_times_records_one_fault_and_a_silent_restart_one_more(tmp_path):
    """Ray Train calls `after_exception` on every poll while a worker group's errors stand (a drain's
    preempting state, polled every 0.25 s): one record per worker group. A worker group Ray restarts
    without any error reaching the callback is a restart too."""
    context = types.SimpleNamespace(run_config=RunConfig(name="run", storage_path=str(tmp_path)))
    recorder = AttemptRecorder()
    _started(recorder, context)
    recorder.after_report(
        context, [{"step": 4, HOST_KEY: host} for host in HOSTS.values()], checkpoint=object()
    )
    preempted = {1: WorkerHealthCheckFailedError("x", RayActorError(error_msg=DEATH))}
    for _ in range(40):
        recorder.after_exception(context, preempted)
    filesystem = pyarrow.fs.LocalFileSystem()
    assert len(read_attempts(filesystem, str(tmp_path / "run"))) == 1
    _started(recorder, context)  # the restart after it: no new record
    assert len(read_attempts(filesystem, str(tmp_path / "run"))) == 1
    _started(recorder, context)  # restarted again, no error heard
    attempts = read_attempts(filesystem, str(tmp_path / "run"))
    assert [attempt["cause"] for attempt in attempts][1] == RESTARTED_WITHOUT_ERROR
    assert attempts[1]["node"] is None and attempts[1]["resumed_from_step"] == 4


def test_a_hang_note_of_an_earlier_worker_group_is_not_blamed_for_a_later_fault(tmp_path):
    context = types.SimpleNamespace(run_config=RunConfig(name="run", storage_path=str(tmp_path)))
    storage = context.run_config.storage_context
    note = {"cause": "rank 1 on ip-10-0-1-7 stopped its step", "ranks": [1], "attempt": 1}
    recorder = AttemptRecorder()
    for _ in range(2):
        _started(recorder, context)
    path = f"{storage.experiment_fs_path}/{HANG_NOTE_FILE}"
    storage.storage_filesystem.create_dir(storage.experiment_fs_path)
    with storage.storage_filesystem.open_output_stream(path) as out:
        out.write(json.dumps(note).encode())
    recorder.after_exception(context, {0: RuntimeError("NCCL error")})
    [_, fault] = read_attempts(pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert fault["cause"].startswith("rank 0") and "stopped its step" not in fault["cause"]


def _attempt_on_two_nodes(tmp_path, recorder):
    """A worker group whose rank 0 wrote its nodes (`RaySession.nodes`): ranks 0-3 on a, 4-7 on b."""
    context = types.SimpleNamespace(run_config=RunConfig(name="run", storage_path=str(tmp_path)))
    storage = context.run_config.storage_context
    storage.storage_filesystem.create_dir(storage.experiment_fs_path)
    _started(recorder, context)
    nodes = ["a"] * 4 + ["b"] * 4
    write_attempt_nodes(
        storage.storage_filesystem, storage.experiment_fs_path, 1, nodes, ["ray-a"] * 4 + ["ray-b"] * 4
    )
    return context


def test_a_lost_node_is_named_once_rays_gcs_declares_it_dead_not_the_survivor(tmp_path):
    """The survivors' processes die under NCCL's error handling before the GCS declares b dead: the
    controller waits for that word (up to NODE_DEATH_SETTLE_S) and names b."""
    answers = iter([{"ray-a", "ray-b"}, {"ray-a", "ray-b"}, {"ray-a"}])
    slept: list[float] = []
    recorder = AttemptRecorder(alive=lambda: next(answers), sleep=slept.append)
    context = _attempt_on_two_nodes(tmp_path, recorder)
    recorder.after_exception(context, {rank: actor_death(PROCESS_DIED) for rank in range(4)})
    [fault] = read_attempts(pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert fault["node"] == "b" and fault["cause"].startswith("node b was lost") and slept == [1.0, 1.0]
    assert fault["drained"] is False


def test_deaths_on_one_node_with_every_node_alive_name_it_after_the_wait(tmp_path):
    slept: list[float] = []
    recorder = AttemptRecorder(alive=lambda: {"ray-a", "ray-b"}, settle_s=3.0, sleep=slept.append)
    context = _attempt_on_two_nodes(tmp_path, recorder)
    recorder.after_exception(context, {rank: actor_death(PROCESS_DIED) for rank in range(4, 8)})
    [fault] = read_attempts(pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert fault["node"] == "b" and fault["cause"].startswith("rank 4 on b died") and len(slept) == 3


def test_a_drained_nodes_deaths_are_recorded_as_a_drain(tmp_path):
    recorder = AttemptRecorder(alive=lambda: {"ray-a"})
    context = _attempt_on_two_nodes(tmp_path, recorder)
    recorder.after_exception(context, {rank: actor_death(NODE_DIED, preempted=True) for rank in range(4, 8)})
    [fault] = read_attempts(pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert (fault["node"], fault["drained"]) == ("b", True)
    assert fault["cause"].startswith("node b was drained")
