"""Checks on the launching process before any worker starts, so that a model or tokenizer
the Hugging Face Hub cannot deliver, a package a flag needs, or a Ray cluster that is not there
is one line instead of a traceback from every worker. Light to import: none of it needs torch
or Ray, so the CLI answers a usage error before it loads either."""

from __future__ import annotations

import os
import socket
from typing import Protocol

from training.config.presets import BYTE_TOKENIZER
from training.config.run_config import TrainConfig
from training.data.tokenizer import load_tokenizer
from training.errors import MODEL_SOURCE_FIX, UsageError, first_line


def check_model_files(config: TrainConfig) -> None:
    """Fetch (or find cached) the pretrained model's config and the corpus tokenizer."""
    if config.init == "pretrained":
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(config.model_id)
        except OSError as error:
            raise UsageError(
                f"--model-id {config.model_id}: {first_line(error)} To fix: {MODEL_SOURCE_FIX.format(name=config.model_id)}"
            ) from error
    if not config.synthetic_data and config.tokenizer != BYTE_TOKENIZER:
        try:
            load_tokenizer(config.tokenizer)
        except OSError as error:
            raise UsageError(
                f"--tokenizer {config.tokenizer}: {first_line(error)} To fix: {MODEL_SOURCE_FIX.format(name=config.tokenizer)}"
            ) from error


def check_packages(config: TrainConfig) -> None:
    """torchao for --float8, tensorboardX for --tensorboard (Ray Train brings it; a torchrun-only
    environment may not): the workers run the same image as this process."""
    if config.float8:
        try:
            import torchao.float8  # noqa: F401
        except ImportError as error:
            raise UsageError(
                f"--float8 needs torchao ({first_line(error)}): pip install torchao==0.18.0, or pass --no-float8"
            ) from error
    if config.tensorboard:
        try:
            import tensorboardX  # noqa: F401
        except ImportError as error:
            raise UsageError(
                f"--tensorboard needs tensorboardX ({first_line(error)}): pip install tensorboardX==2.6.5, "
                "or pass --no-tensorboard"
            ) from error


JOIN_TIMEOUT_S = 10  # to reach RAY_ADDRESS before `ray.init`, which would wait minutes


class WorkerGroupSettings(Protocol):
    """What starting a worker group reads: the job's TrainConfig, the fabric probe's settings."""

    @property
    def local(self) -> bool: ...
    @property
    def workers(self) -> int | None: ...
    @property
    def use_gpu(self) -> bool: ...
    @property
    def gpus_per_worker(self) -> float: ...
    @property
    def cpus_per_worker(self) -> float: ...


def cluster_address() -> str:
    """The Ray cluster the user meant: RAY_ADDRESS, which Ray's job supervisor sets for every job
    driver on a cluster (ray/dashboard/modules/job/job_supervisor.py, `_get_driver_env_vars`).
    Never `auto`, which joins whatever Ray runs on this machine, another user's embedded one
    included. A `host:port` that does not accept a TCP connection within JOIN_TIMEOUT_S is a
    usage error: `ray.init` would wait for its GCS for minutes."""
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if not address:
        raise UsageError(
            "no Ray cluster given: set RAY_ADDRESS to the head's host:port (Ray jobs on a cluster "
            "have it set), or pass --local to start one in this process"
        )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=JOIN_TIMEOUT_S).close()
        except OSError as error:
            raise UsageError(
                f"RAY_ADDRESS={address}: no Ray cluster answers there ({error}); start one, fix the "
                "address, or pass --local to start one in this process"
            ) from error
    return address


def _local_cpu_workers_max() -> int:
    """An embedded Ray on CPU gives each worker a process and its share of the cores: more workers
    than CPUs only thrash (each gloo step waits for the slowest). Two, the default run's, always go."""
    return max(os.cpu_count() or 1, 2)


def check_worker_group(settings: WorkerGroupSettings) -> str | None:
    """The worker group can start: a cluster to join (its address, returned), or an embedded one
    the machine can hold (None)."""
    if not settings.local:
        return cluster_address()
    most = _local_cpu_workers_max()
    if not settings.use_gpu and settings.workers is not None and settings.workers > most:
        raise UsageError(
            f"--local --workers {settings.workers}: this machine has {os.cpu_count()} CPUs; a local CPU "
            f"run takes at most one worker per CPU (--workers {most} or fewer)"
        )
    return None
