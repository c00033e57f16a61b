"""Ray Train launcher: TorchTrainer on an embedded or existing Ray cluster.

With `training.launch.local_drain` (the --local driver's SIGTERM),
`training.launch.attempt_store` (the run's attempts, recorded by Ray Train's controller) and
`training.launch.ray_corpus` (the corpus, read by Ray Data), the only modules of the package that
import ray. Workers run `train` from
training.loop through a `RaySession`; `run_on_workers` runs any function of a
device on a worker group the same way (the fabric probe's). The driver puts the corpus in the
corpus cache (`training.launch.ray_corpus`); each worker maps the cached rows and deals itself its
share of each epoch like a torchrun rank.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, CheckpointUploadMode

# Ray Train V2 (the default since Ray 2.51, needed for the training function's return
# value), imported from where it lives so type checkers see it rather than V1.
from ray.train.v2.api.config import (
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
)
from ray.train.v2.api.result import Result
from ray.train.v2.torch.torch_trainer import TorchTrainer

from training.components import storage
from training.components.checkpoint import (
    CHECKPOINT_SCORE,
    checkpoint_name,
    not_whole,
    remove_abandoned,
    resume_point,
)
from training.components.watchdog import HANG_NOTE_FILE
from training.config.run_config import TrainConfig, check_hsdp_replicas
from training.config.settings import WORKER_GROUP_START_TIMEOUT_ENV
from training.data.corpus_cache import CachedCorpus, cached_corpus_rows
from training.data.packing import PackedCorpus
from training.distributed.nodes import gather_nodes, this_node
from training.errors import DivergedError, RestartRefusedError, RunFailedError, UsageError
from training.launch import local_drain
from training.launch.attempt_store import (
    HOST_KEY,
    AttemptBoundary,
    AttemptRecorder,
    clear_attempts,
    in_run,
    read_attempts,
    write_attempt_nodes,
)
from training.launch.launch_checks import WorkerGroupSettings, check_worker_group
from training.launch.ray_corpus import cached_corpus
from training.launch.ray_quiet import plain_prefixes_unless_terminal, quiet_driver_logs, quiet_report_logger
from training.metrics.artifacts import write_run_files
from training.session import Notice

# Ray Train's controller takes each worker's report off a one-slot queue when it
# polls, by default every 2 s; until then ray.train.report blocks. Reporting every
# step would cap training at one step per poll, so the driver (whose environment
# Ray hands to the controller) asks for a shorter poll.
CONTROLLER_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
CONTROLLER_POLL_S = "0.25"
# A restarted worker group waits this long for its workers' resources before Ray Train gives up
# on the attempt (ray/train/v2/_internal/constants.py: RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S,
# 60 s by default): on a cluster the worker of a lost node waits for the node group to launch a
# replacement and the GPU, EFA and Ray pods to start on it, which takes minutes, not one.
WORKER_GROUP_START_TIMEOUT_S = 900.0
DIVERGED_KEY = "diverged"  # in a worker's return value: the run stopped on a non-finite step
USAGE_KEY = "usage_error"  # in a worker's return value: a setting the run cannot start with
REFUSED_KEY = "restart_refused"  # in a worker's return value: a restart that cannot help
# Ray Train's PreemptionWatcher reads Ray Core's draining nodes every 5 s by default; a drain's
# deadline is 30 s away (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S), so the driver asks for every second
# (one small GCS call), which leaves the checkpoint more of it. The controller takes it from the
# driver's environment (ray 2.58: ray/train/v2/_internal/constants.py, the variables it propagates).
PREEMPTION_POLL_ENV = "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"
PREEMPTION_POLL_S = "1"
# Restarts after a node's preemption (a drain: eviction, spot reclaim, repair), counted apart from
# --max-failures by Ray Train; bounded, so a node group that keeps losing nodes ends the run.
MAX_PREEMPTION_FAILURES = 5
# What the job chooses of PyTorch's distributed behaviour, in every worker's environment:
# - the flight recorder: each rank keeps its last collectives, which the hang watchdog reads
#   (training/components/watchdog.py);
# - NCCL's error handling, which Ray Train would otherwise choose (ray 2.58: ray/train/torch/config.py
#   sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 where unset; torch's own default is 3): 1, TearDown. On an
#   NCCL error or timeout ProcessGroupNCCL's watchdog aborts the communicators, then ends the process
#   (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, `ErrorHandlingMode`; 3 ends it without the
#   abort), so a peer's loss ends the survivors rather than blocking them for the process group's
#   30-minute timeout. Ray Train's controller then sees the survivors' actors
#   dead too, and a fault is named by kind (`training.components.attempts.fault_cause`).
TORCH_WORKER_ENV = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


class RaySession:
    """The loop's view of a Ray Train worker."""

    def __init__(
        self, resume_from: str | None, corpus: CachedCorpus | None, eval_corpus: CachedCorpus | None
    ) -> None:
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_world_size = context.get_local_world_size()
        self.device = ray.train.torch.get_device()
        self.resume_from = resume_from
        self.cached_corpus = corpus
        self.cached_eval_corpus = eval_corpus
        self.outcome: dict[str, Any] | None = None
        self.host = this_node()
        quiet_report_logger()

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        """Ray's latest committed checkpoint (after a restart) wins over the one to start from;
        either is read in place, each rank its own shards. One that is not whole gives way to the
        newest whole one of the run, said in one line; rank 0 removes the folders of writes that
        never committed."""
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None and self.resume_from:
            if problems := not_whole(self.resume_from):
                raise UsageError(
                    f"--resume-from {self.resume_from}: not a whole checkpoint ({'; '.join(problems)})"
                )
            yield self.resume_from
            return
        latest = None if checkpoint is None else storage.location_of(checkpoint.filesystem, checkpoint.path)
        point = resume_point(latest, self._run_location())
        if self.rank == 0:
            if point.line is not None:
                print(point.line, flush=True)
            removed = remove_abandoned(self._run_location(), point.location)
            if removed:
                print(
                    f"removed {len(removed)} checkpoint folders no commit finished: {', '.join(removed)}",
                    flush=True,
                )
        yield point.location

    @contextlib.contextmanager
    def open_checkpoint(self, location: str) -> Iterator[str]:
        yield location  # a local path or a URI (s3://), read in place

    def corpus(self, config: TrainConfig) -> PackedCorpus:
        if self.cached_corpus is None:
            raise ValueError("this run was launched without a corpus")
        # Mapped from the node's disk: the workers of a node share its page cache.
        return cached_corpus_rows(self.cached_corpus)

    def eval_rows(self, config: TrainConfig) -> PackedCorpus:
        if self.cached_eval_corpus is None:
            raise ValueError("this run was launched without --eval-data")
        return cached_corpus_rows(self.cached_eval_corpus)

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        metrics = {**metrics, HOST_KEY: self.host}
        if save is None:
            ray.train.report(metrics)
            return
        path = self.checkpoint_folder(step)
        save(path)
        self.publish(metrics, step, path)

    def _run_location(self) -> str:
        """The run's folder in its storage, where every checkpoint is written in place."""
        run_storage = ray.train.get_context().get_storage()
        return storage.location_of(run_storage.storage_filesystem, run_storage.experiment_fs_path)

    def checkpoint_folder(self, step: int) -> str:
        """The checkpoint's folder in the run's storage, which every rank writes its shards into."""
        return storage.join(self._run_location(), checkpoint_name(step))

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        """Every rank at the same step (Ray Train requires all ranks to report alike). The folder is
        already in the run's storage: Ray registers it where it is (`NO_UPLOAD`), once every rank
        has reported (ray 2.58: ray/train/v2/_internal/execution/context.py, `report`)."""
        run_storage = ray.train.get_context().get_storage()
        ray.train.report(
            {**metrics, HOST_KEY: self.host},
            checkpoint=Checkpoint(
                f"{run_storage.experiment_fs_path.rstrip('/')}/{checkpoint_name(step)}",
                filesystem=run_storage.storage_filesystem,
            ),
            checkpoint_dir_name=checkpoint_name(step),
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.outcome = {"summary": summary, "history": history}

    def nodes(self) -> list[str]:
        """Every rank's node, gathered; rank 0 keeps them with Ray's node ids for the controller's
        record (`AttemptRecorder`), which names a fault of this attempt by them."""
        pairs = gather_nodes(f"{self.host} {ray.get_runtime_context().get_node_id()}")
        nodes, ray_nodes = zip(*(pair.split(" ", 1) for pair in pairs), strict=True)
        if self.rank == 0:
            storage = ray.train.get_context().get_storage()
            attempt = len(self.faults()) + 1  # one record a worker group: the faults before it plus one
            write_attempt_nodes(
                storage.storage_filesystem, storage.experiment_fs_path, attempt, list(nodes), list(ray_nodes)
            )
        return list(nodes)

    def faults(self) -> list[dict[str, Any]]:
        # Written by the controller's AttemptRecorder before it restarts the worker group.
        storage = ray.train.get_context().get_storage()
        return read_attempts(storage.storage_filesystem, storage.experiment_fs_path)

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """The hang watchdog's finding, kept in the run's folder for the controller's record
        (`AttemptRecorder`): under gloo this rank exits, and its death alone would be the cause."""
        storage = ray.train.get_context().get_storage()
        path = in_run(storage.experiment_fs_path, HANG_NOTE_FILE)
        # The worker group it belongs to: one record a worker group, so the faults before it plus one.
        note = {"cause": line, "ranks": list(ranks), "attempt": len(self.faults()) + 1}
        with storage.storage_filesystem.open_output_stream(path) as out:
            out.write(json.dumps(note).encode())

    def preemption_notice(self) -> Notice | None:
        """Ray Train's notice that a node of the worker group is being drained; a barrier every rank
        calls at the same step (`training.components.drain.DrainWatch`)."""
        info = ray.train.get_preemption_info()
        if info is None:
            return None
        nodes = ", ".join(node[:8] for node in info.preempted_node_ids)
        ranks = ", ".join(map(str, info.preempted_ranks))
        deadline = None if info.deadline_ms is None else info.deadline_ms / 1000
        return Notice(f"Ray Train preemption of node {nodes}, ranks {ranks}", deadline)


def train_loop_per_worker(worker_config: dict[str, Any]) -> dict[str, Any] | None:
    """Entry point of every worker; rank 0's return value reaches the driver."""
    from training.loop import train

    config = TrainConfig.from_dict(worker_config["config"])
    session = RaySession(config.resume_from, worker_config["corpus"], worker_config["eval_corpus"])
    try:
        train(config, session)
    except DivergedError as error:
        # Returned, not raised: every rank stops at the same step, so none waits in a collective,
        # and a raised error would print each worker's traceback and be retried (--max-failures)
        # from the last checkpoint, to diverge again.
        return {DIVERGED_KEY: str(error)}
    except UsageError as error:
        # The same on every rank (a checkpoint that does not fit the flags, a held-out corpus too
        # small): one line at the driver, not a traceback per worker and retries.
        return {USAGE_KEY: str(error)}
    except RestartRefusedError as error:
        # Judged alike on every rank from the stored attempts: raised, it would be retried again.
        return {REFUSED_KEY: str(error)}
    return session.outcome


def _start_ray(config: WorkerGroupSettings, address: str | None) -> None:
    """Join the cluster at `address`, or start an embedded one (None)."""
    plain_prefixes_unless_terminal()
    if address is not None:
        ray.init(address=address, runtime_env={"env_vars": TORCH_WORKER_ENV})
        quiet_driver_logs()
        return
    workers = config.workers or 1
    # Room for every worker plus one CPU for Ray Data's read and tokenize tasks.
    cpus = max(os.cpu_count() or 1, int(workers * config.cpus_per_worker) + 1)
    # Workers start elsewhere; they must still import this package.
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    ray.init(
        address="local",  # a fresh embedded cluster, even when RAY_ADDRESS points elsewhere
        num_cpus=cpus,
        include_dashboard=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": python_path, **TORCH_WORKER_ENV},
            "worker_process_setup_hook": "training.launch.ray_quiet.quiet_placement_group_cleaner",
        },
    )
    quiet_driver_logs()


def _worker_count(config: WorkerGroupSettings) -> int:
    if config.workers is not None:
        if config.local and config.use_gpu:
            # An embedded Ray cannot grow: asking for absent GPUs would wait forever.
            gpus = ray.cluster_resources().get("GPU", 0)
            if gpus < config.workers * config.gpus_per_worker:
                raise UsageError(
                    f"{config.workers} workers x {config.gpus_per_worker:g} GPU, but this machine has "
                    f"{gpus:g}: pass --no-gpu or fewer --workers"
                )
        return config.workers
    if not config.use_gpu:
        raise UsageError("--workers is required with --no-gpu on a cluster")
    gpus = ray.cluster_resources().get("GPU", 0)
    workers = int(gpus // config.gpus_per_worker)
    if workers < 1:
        raise UsageError("the Ray cluster has no GPUs: pass --no-gpu and --workers N, or add GPU nodes")
    return workers


@contextlib.contextmanager
def _worker_group(settings: WorkerGroupSettings) -> Iterator[int]:
    """A Ray cluster joined or started for the run, and how many workers it runs."""
    _start_ray(settings, check_worker_group(settings))
    try:
        yield _worker_count(settings)
    finally:
        ray.shutdown()


def _fit(
    loop: Callable[[dict[str, Any]], Any],
    loop_config: dict[str, Any],
    settings: WorkerGroupSettings,
    workers: int,
    run_config: RunConfig,
) -> Result:
    resources = {"CPU": settings.cpus_per_worker}
    if settings.use_gpu:
        resources["GPU"] = settings.gpus_per_worker
    trainer = TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=workers, use_gpu=settings.use_gpu, resources_per_worker=resources
        ),
        run_config=run_config,
    )
    try:
        # fit is annotated with ray.train.Result, which type checkers resolve to V1's class.
        return cast(Result, trainer.fit())
    except ray.train.TrainingFailedError as error:
        raise RunFailedError(str(error)) from error


def start_retries(recovery_budget_s: float, start_timeout_s: float) -> int:
    """How many times Ray Train may start a worker group that timed out waiting for its resources
    (it retries them without limit by default, FailureConfig.controller_failure_limit -1): as many
    start timeouts as fit in --recovery-budget-s, and at least one."""
    return max(1, math.ceil(recovery_budget_s / start_timeout_s))


def run(config: TrainConfig) -> dict[str, Any]:
    """Train on Ray and return the summary (also written to the run folder)."""
    os.environ.setdefault(CONTROLLER_POLL_ENV, CONTROLLER_POLL_S)
    os.environ.setdefault(PREEMPTION_POLL_ENV, PREEMPTION_POLL_S)
    os.environ.setdefault(WORKER_GROUP_START_TIMEOUT_ENV, str(WORKER_GROUP_START_TIMEOUT_S))
    with _worker_group(config) as workers:
        try:
            check_hsdp_replicas(workers, config.hsdp_replicas)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if config.local:
            # What `ray start --block` does for a pod's node on SIGTERM (the module says why).
            local_drain.install(f"{config.storage_path.rstrip('/')}/{config.run_name}", config.run_name)
        corpus = None if config.synthetic_data else cached_corpus(config, workers)
        eval_corpus = None if config.eval_data is None else cached_corpus(config, workers, "--eval-data")
        recorder = AttemptRecorder()
        run_config = RunConfig(
            name=config.run_name,
            storage_path=config.storage_path,
            failure_config=FailureConfig(
                max_failures=config.max_failures,
                max_preemption_failures=MAX_PREEMPTION_FAILURES,
                controller_failure_limit=start_retries(
                    config.recovery_budget_s, float(os.environ[WORKER_GROUP_START_TIMEOUT_ENV])
                ),
            ),
            # The latest checkpoint is always kept too (to resume from); with --eval-data every
            # checkpoint is evaluated and the lowest eval_loss ranks first
            # (training.components.checkpoint.checkpoints_kept, which torchrun applies).
            checkpoint_config=CheckpointConfig(
                num_to_keep=config.keep_checkpoints,
                checkpoint_score_attribute=None if config.eval_data is None else CHECKPOINT_SCORE,
                checkpoint_score_order="min",
            ),
            # A line per report would bury the training's own progress lines.
            logging_config=LoggingConfig(log_level="WARNING"),
            # RunConfig takes any RayTrainCallback (ray 2.58: api/config.py checks that), its annotation
            # says UserCallback: the boundary is an internal WorkerGroupCallback.
            callbacks=[recorder, AttemptBoundary(recorder)],  # type: ignore[list-item]
        )
        clear_attempts(run_config)
        result = _fit(
            train_loop_per_worker,
            {
                "config": {**config.to_dict(), "workers": workers},
                "corpus": corpus,
                "eval_corpus": eval_corpus,
            },
            config,
            workers,
            run_config,
        )
        outcome = result.return_value
        if outcome is None:
            raise RunFailedError("rank 0 returned no summary")
        if DIVERGED_KEY in outcome:
            raise DivergedError(outcome[DIVERGED_KEY])
        if USAGE_KEY in outcome:
            raise UsageError(outcome[USAGE_KEY])
        if REFUSED_KEY in outcome:
            raise RestartRefusedError(outcome[REFUSED_KEY])
        filesystem, run_path = result.filesystem, result.path

        def write(name: str, data: bytes) -> None:
            with filesystem.open_output_stream(f"{run_path}/{name}") as stream:
                stream.write(data)

        run_dir = f"{config.storage_path.rstrip('/')}/{config.run_name}"
        return write_run_files(write, run_dir, outcome["summary"], outcome["history"])


def _call_with_device(worker_config: dict[str, Any]) -> Any:
    """Entry point of every worker of `run_on_workers`."""
    return worker_config["function"](ray.train.torch.get_device(), worker_config["argument"])


def run_on_workers(
    settings: WorkerGroupSettings, function: Callable[[torch.device, Any], Any], argument: Any
) -> Any:
    """`function(device, argument)` on every worker of a worker group, whose process group Ray Train
    has set up (NCCL with GPUs, gloo without); rank 0's return value. `function` is a module-level
    function, so workers import it rather than unpickle a copy. Nothing is checkpointed: the run's
    folder is a temporary one on this machine (a worker on another node makes an empty one there)."""
    with _worker_group(settings) as workers, tempfile.TemporaryDirectory(prefix="ray-train-") as folder:
        result = _fit(
            _call_with_device,
            {"function": function, "argument": argument},
            settings,
            workers,
            RunConfig(name="workers", storage_path=folder, logging_config=LoggingConfig(log_level="WARNING")),
        )
    return result.return_value
