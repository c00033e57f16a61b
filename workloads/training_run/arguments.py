"""The stack's `training` settings as flags of `python -m training`."""

from __future__ import annotations

from infra.config import ConfigError, TrainingSettings


def job_arguments(
    training: TrainingSettings, world_size: int, gpus_per_worker: int, storage_path: str
) -> list[str]:
    """Flags of `python -m training` for the stack's `training` settings.

    `world_size` is the number of training workers the GPU nodes hold (their GPUs divided by
    `gpus_per_worker`); `training.workers` may ask for fewer. `hsdp` maps to `--hsdp-replicas
    auto` (shard inside a node, replicate across) or 1 (plain FSDP), so the stack setting wins
    over the preset's default. Unset optional settings leave the preset's value.
    """
    workers = training.workers or world_size
    if workers > world_size:
        raise ConfigError(
            f"config key 'training.workers' = {workers}: the GPU nodes hold {world_size} workers of "
            f"{gpus_per_worker} GPU each; set training.workers to {world_size} or less, or add GPU nodes"
        )
    args = [
        "--preset",
        training.preset,
        "--model-id",
        training.model_id,
        "--init",
        training.init,
        "--workers",
        str(workers),
        "--use-gpu",
        "--gpus-per-worker",
        str(gpus_per_worker),
        "--hsdp-replicas",
        "auto" if training.hsdp else "1",
        "--storage-path",
        storage_path,
    ]
    optional = (
        ("--steps", training.steps),
        ("--seq-len", training.seq_len),
        ("--batch-size", training.batch_size),
        ("--lr", training.learning_rate),
        ("--checkpoint-every", training.checkpoint_every),
    )
    for flag, value in optional:
        if value is not None:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return args
