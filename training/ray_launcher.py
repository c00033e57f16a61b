"""Ray Train launcher: TorchTrainer on an embedded or existing Ray cluster.

The only module of the package that imports ray. Workers run `train` from
training.loop through a `RaySession`; the corpus goes through Ray Data and
reaches each worker via `ray.train.get_dataset_shard`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.data
import ray.train
import ray.train.torch
from pyarrow import fs as pyarrow_fs
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from training.artifacts import write_run_files
from training.checkpoint import CHECKPOINTS_KEPT
from training.config import (
    CORPUS_SUFFIXES,
    TrainConfig,
    check_hsdp_replicas,
    corpus_files,
    corpus_format,
    is_uri,
)
from training.data import TEXT_COLUMN, TOKENS_COLUMN, decode_text_files, tokenize_and_pack
from training.ray_quiet import quiet_report_logger

DATASET_NAME = "train"
# Ray Train's controller takes each worker's report off a one-slot queue when it
# polls, by default every 2 s; until then ray.train.report blocks. Reporting every
# step would cap training at one step per poll, so the driver (whose environment
# Ray hands to the controller) asks for a shorter poll.
CONTROLLER_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
CONTROLLER_POLL_S = "0.25"


class UsageError(ValueError):
    """A setting that cannot work on this cluster; the CLI reports it like a bad flag."""


class RunFailedError(RuntimeError):
    """Training failed after its retries."""


class RaySession:
    """The loop's view of a Ray Train worker."""

    def __init__(self, resume_from: str | None) -> None:
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.local_world_size = context.get_local_world_size()
        self.device = ray.train.torch.get_device()
        self.resume_from = resume_from
        self.outcome: dict[str, Any] | None = None
        quiet_report_logger()

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        # Ray's own latest checkpoint (after a restart) wins over the one to start from.
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None and self.resume_from:
            checkpoint = Checkpoint(self.resume_from)
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as path:
            yield path

    def corpus_batches(self, config: TrainConfig) -> Iterator[np.ndarray]:
        shard = ray.train.get_dataset_shard(DATASET_NAME)
        while True:  # one pass over the corpus per iteration
            batches = shard.iter_batches(batch_size=config.batch_size, batch_format="numpy", drop_last=True)
            produced = 0
            for batch in batches:
                produced += 1
                yield batch[TOKENS_COLUMN]
            if produced == 0:
                raise ValueError(
                    f"the corpus packs into too few rows of {config.seq_len + 1} tokens for "
                    f"{self.world_size} workers x batch {config.batch_size}"
                )

    def report(self, metrics: dict[str, Any], step: int, save: Callable[[str], None] | None) -> None:
        if save is None:
            ray.train.report(metrics)
            return
        # Each rank writes its shards to a private folder; Ray merges them in storage.
        with tempfile.TemporaryDirectory(prefix="checkpoint-") as path:
            save(path)
            ray.train.report(
                metrics,
                checkpoint=Checkpoint.from_directory(path),
                checkpoint_dir_name=f"checkpoint_{step:06d}",
            )

    def finish(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.outcome = {"summary": summary, "history": history}


def train_loop_per_worker(config_values: dict[str, Any]) -> dict[str, Any] | None:
    """Entry point of every worker; rank 0's return value reaches the driver."""
    from training.loop import train

    config = TrainConfig.from_dict(config_values)
    session = RaySession(config.resume_from)
    train(config, session)
    return session.outcome


def _list_remote_corpus(uri: str) -> list[str]:
    filesystem, root = pyarrow_fs.FileSystem.from_uri(uri)
    found = filesystem.get_file_info(pyarrow_fs.FileSelector(root, recursive=True, allow_not_found=True))
    files = sorted(info.path for info in found if info.is_file and Path(info.path).suffix in CORPUS_SUFFIXES)
    if not files:
        info = filesystem.get_file_info(root)
        if info.is_file and Path(root).suffix in CORPUS_SUFFIXES:
            files = [root]
    if not files:
        raise UsageError(f"--data {uri}: no {'/'.join(CORPUS_SUFFIXES)} files there")
    scheme = uri.split("://", 1)[0]
    return [f"{scheme}://{path}" for path in files]


def build_dataset(config: TrainConfig) -> ray.data.Dataset:
    """Read the corpus, tokenize and pack it into rows of seq_len + 1 tokens."""
    if is_uri(config.data):
        files = _list_remote_corpus(config.data)
    else:
        files = corpus_files(config.data)
        if not config.local:
            # On a cluster only the driver's node holds these files.
            files = [f"local://{path}" for path in files]
    by_kind: dict[str, list[str]] = {"text": [], "json": [], "parquet": []}
    for path in files:
        by_kind[corpus_format(path)].append(path)
    parts = []
    if by_kind["text"]:
        parts.append(ray.data.read_binary_files(by_kind["text"]).map_batches(decode_text_files))
    if by_kind["json"]:
        parts.append(ray.data.read_json(by_kind["json"], lines=True).select_columns([TEXT_COLUMN]))
    if by_kind["parquet"]:
        parts.append(ray.data.read_parquet(by_kind["parquet"], columns=[TEXT_COLUMN]))
    documents = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    return documents.map_batches(
        tokenize_and_pack,
        fn_kwargs={"tokenizer": config.tokenizer, "seq_len": config.seq_len},
        batch_format="numpy",
    )


def _configure_ray_data() -> None:
    """Set on the driver; Ray Train copies it into the ingest of the training datasets."""
    context = ray.data.DataContext.get_current()
    # The split coordinator's progress bars would flood the job log with redraws.
    context.enable_progress_bars = False
    # Ordered blocks give every worker the same rows on every run, so a resumed
    # run replays exactly the data of an uninterrupted one.
    context.execution_options.preserve_order = True


def _start_ray(config: TrainConfig) -> None:
    if not config.local:
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
        return
    workers = config.workers or 1
    # Room for every worker plus one CPU for Ray Data's read and tokenize tasks.
    cpus = max(os.cpu_count() or 1, int(workers * config.cpus_per_worker) + 1)
    # Workers start elsewhere; they must still import this package.
    package_root = str(Path(__file__).resolve().parent.parent)
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    ray.init(
        address="local",  # a fresh embedded cluster, even when RAY_ADDRESS points elsewhere
        num_cpus=cpus,
        include_dashboard=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": python_path},
            "worker_process_setup_hook": "training.ray_quiet.quiet_placement_group_cleaner",
        },
    )


def _worker_count(config: TrainConfig) -> int:
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


def run(config: TrainConfig) -> dict[str, Any]:
    """Train on Ray and return the summary (also written to the run folder)."""
    os.environ.setdefault(CONTROLLER_POLL_ENV, CONTROLLER_POLL_S)
    _start_ray(config)
    try:
        workers = _worker_count(config)
        try:
            check_hsdp_replicas(workers, config.hsdp_replicas)
        except ValueError as error:
            raise UsageError(str(error)) from None
        resources = {"CPU": config.cpus_per_worker}
        if config.use_gpu:
            resources["GPU"] = config.gpus_per_worker
        _configure_ray_data()
        datasets = {} if config.synthetic_data else {DATASET_NAME: build_dataset(config)}
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={**config.to_dict(), "workers": workers},
            scaling_config=ScalingConfig(
                num_workers=workers, use_gpu=config.use_gpu, resources_per_worker=resources
            ),
            run_config=RunConfig(
                name=config.run_name,
                storage_path=config.storage_path,
                failure_config=FailureConfig(max_failures=config.max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
                # A line per report would bury the training's own progress lines.
                logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            ),
            datasets=datasets,
        )
        try:
            result = trainer.fit()
        except ray.train.TrainingFailedError as error:
            raise RunFailedError(str(error)) from error
        outcome = result.return_value
        if outcome is None:
            raise RunFailedError("rank 0 returned no summary")
        filesystem, run_path = result.filesystem, result.path

        def write(name: str, data: bytes) -> None:
            with filesystem.open_output_stream(f"{run_path}/{name}") as stream:
                stream.write(data)

        run_dir = f"{config.storage_path.rstrip('/')}/{config.run_name}"
        return write_run_files(write, run_dir, outcome["summary"], outcome["history"])
    finally:
        ray.shutdown()
