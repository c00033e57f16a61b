"""The job's flags of `python -m training`: the stack's, then those the program owns."""

from __future__ import annotations

from infra.config import ConfigError, TrainingSettings, training_config


def job_arguments(
    training: TrainingSettings, world_size: int, gpus_per_worker: int, storage_path: str
) -> list[str]:
    """The stack's training flags plus the ones in `infra.config.PROGRAM_FLAGS`.

    `world_size` is the number of training workers the GPU nodes hold (their GPUs divided by
    `gpus_per_worker`); the job uses them all unless the stack's `training.workers` asks for
    fewer. The whole command line is checked once more by the training parser, which now sees
    the worker count.
    """
    args = list(training.flags)
    workers_set = "--workers" in args
    if not workers_set:
        args += ["--workers", str(world_size)]
    args += ["--use-gpu", "--gpus-per-worker", str(gpus_per_worker), "--storage-path", storage_path]
    try:
        workers = training_config(args).workers
    except ConfigError as error:
        if workers_set:
            raise
        raise ConfigError(f"{error} (workers is the GPU count of the GPU nodes, {world_size})") from None
    if workers is not None and workers > world_size:
        raise ConfigError(
            f"config key 'training.workers' = {workers}: the GPU nodes hold {world_size} workers of "
            f"{gpus_per_worker} GPU each; set training.workers to {world_size} or less, or add GPU nodes"
        )
    return args
