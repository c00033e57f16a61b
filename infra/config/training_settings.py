"""The stack's `training` block: camelCase keys that are the flags of `python -m training`, the
keys that say how `pulumi up` judges the run, and the job's whole command line.

The job's own parser (`training.config.run_config`) is the one judge of a flag's value; this module only
bridges its flags to stack keys (`seqLen: 256` is `--seq-len 256`) and adds the flags the
program owns. It lives in `infra` so the code shipped to the pods carries none of it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any

import pulumi
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from infra.config.parsing import ConfigError, as_int, did_you_mean, key_names, one_of, validated
from platform_contract import EXPECTABLE_TRANSPORTS
from training.config.flag_types import parse_deadline
from training.config.run_config import (
    CONFIG_DIR,
    CORPUS_SUFFIXES,
    SYNTHETIC,
    ArgumentsError,
    TrainConfig,
    build_parser,
    is_uri,
    load_model_config,
    parse_flags,
)
from training.config.settings import DEADLINE_FLAG, LEAVE_FAILING_NODE_FLAG, RECOVERY_BUDGET_FLAG
from training.metrics.flops import flops_per_token, peak_flops

# What `pulumi up` trains unless the stack's `training.preset` says otherwise: AWS's reference job.
DEFAULT_TRAINING_PRESET = "smoke"
# Flags of `python -m training` that the program sets itself, and why the stack may not.
PROGRAM_FLAGS = {
    "--storage-path": "checkpoints go to the stack's S3 bucket",
    "--use-gpu": "every worker trains on a GPU of the GPU nodes",
    "--gpus-per-worker": "the program runs one worker per GPU",
    "--local": "the job runs on the cluster's Ray",
    "--launcher": "the job is submitted to the cluster's Ray",
    "--line-rate-gbps": "the GPU node type's network line rate (ec2:DescribeInstanceTypes)",
    LEAVE_FAILING_NODE_FLAG: "with gpuNodeAutoRepair a failing node leaves the job and is repaired",
}
# `ray job submit` joins the job's command line with `subprocess.list2cmdline` and Ray runs it
# with `shell=True` (ray/dashboard/modules/job/cli.py, job_supervisor.py), so a stack value must be
# a word the shell leaves as it is.
_SHELL_WORD = re.compile(r"[A-Za-z0-9._/:@=+,-]+")  # fullmatch: no newline
# Above the best model FLOPs utilisation this loop has reached (60% in bf16 and 68% with float8 on
# an H200, docs/benchmarks.md): a run can be no faster than its FLOPs at this share of the peak.
MFU_CEILING = 0.7
# Former `training` keys, with what replaced them.
RENAMED_TRAINING_KEYS = {
    "hsdp": "use hsdpReplicas: auto (shard inside a node, replicate across nodes) or hsdpReplicas: 1 (plain FSDP)",
}


def _fraction(value: Any) -> float:
    """A share from 0 to 1 (YAML may hand it over as a string)."""
    if isinstance(value, bool):
        raise ValueError("expected a number from 0 to 1")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a number from 0 to 1") from None
    if not 0 <= number <= 1:
        raise ValueError("must be from 0 to 1")
    return number


class TrainingRunKeys(BaseModel):
    """The `training` keys that are no flag of the job: how `pulumi up` judges the run."""

    model_config = ConfigDict(
        frozen=True, strict=True, alias_generator=to_camel, validate_by_name=True, validate_by_alias=True
    )

    expect_transport: Annotated[str, BeforeValidator(one_of(*EXPECTABLE_TRANSPORTS))] = Field(
        default="efa",
        description="transport the run must use, or `pulumi up` fails: "
        + ", ".join(f"`{transport}`" for transport in EXPECTABLE_TRANSPORTS[:-1])
        + f" or `{EXPECTABLE_TRANSPORTS[-1]}`",
    )
    min_busbw_fraction: Annotated[float, BeforeValidator(_fraction)] = Field(
        default=0.0,
        description="with `expectTransport: efa`, the least share of the GPU node's line rate the fabric probe's bus bandwidth must reach at its largest message size, for all_gather and reduce_scatter each, or `pulumi up` fails (all_reduce's is reported, not judged: on two nodes NCCL's tree all_reduce can go beyond the line rate); 0 turns the floor off",
    )
    check_efa_counters: bool = Field(
        default=True,
        description="whether the EFA hardware counters of each worker node must show the fabric probe's traffic "
        "(at least half of what its collectives bring into a node) and the job's, and must be readable, or "
        "`pulumi up` fails; `false` leaves NCCL's own lines as the only proof of EFA, and the stack output "
        "`training.checkEfaCounters` says so",
    )
    timeout_minutes: Annotated[int, BeforeValidator(as_int(1, 7 * 24 * 60, "a week"))] = Field(
        default=60,
        description="how long `pulumi up` follows the job before leaving it running for the next update (at most a week); "
        f"the preview warns when even a run at {MFU_CEILING:.0%} MFU would take longer",
    )


class TrainingSettings(TrainingRunKeys):
    """The training job run by `pulumi up` (the stack's `training` object).

    `flags` are the stack's training settings as flags of `python -m training`, checked by that
    program's own parser; the other fields say how the program judges the run.
    """

    flags: tuple[str, ...] = ("--preset", DEFAULT_TRAINING_PRESET)


# --- the job's flags as camelCase keys -------------------------------------------------------------


def key_of_flag(flag: str) -> str:
    """`--seq-len` -> `seqLen`."""
    head, *rest = flag.lstrip("-").split("-")
    return head + "".join(word.capitalize() for word in rest)


def setting_keys() -> dict[str, str]:
    """Every camelCase key a flag of the parser answers to, with the flag's first spelling
    (`learningRate` and `lr` -> `--lr`); the `--no-` forms of on/off flags are no keys."""
    keys: dict[str, str] = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings:
            negation = isinstance(action, argparse.BooleanOptionalAction) and flag.startswith("--no-")
            if flag.startswith("--") and not negation:
                keys[key_of_flag(flag)] = action.option_strings[0]
    return keys


def setting_flags(key: str, value: object) -> list[str]:
    """The flags of one setting, checked by the parser: (`seqLen`, 256) -> [`--seq-len`, `256`],
    (`compile`, False) -> [`--no-compile`]. Raises `KeyError` for a key that is no flag and
    `ArgumentsError` for a value its flag refuses."""
    flag = setting_keys()[key]
    action = next(action for action in build_parser()._actions if flag in action.option_strings)
    if action.nargs == 0:  # on/off: true or false
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ArgumentsError(f"argument {flag}: expected true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            flags = [flag if value else f"--no-{flag[2:]}"]
        else:
            flags = [flag] if value else []
    else:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ArgumentsError(f"argument {flag}: expected a single value, got {value!r}")
        flags = [flag, str(value)]
    build_parser().parse_args(flags)
    return flags


def training_config(flags: Sequence[str]) -> TrainConfig:
    """The job's flags parsed as `python -m training` parses them on the cluster (whose paths are
    not looked up here); a `ConfigError` in the stack's key names otherwise."""
    try:
        return parse_flags(flags, paths_here=False)
    except ArgumentsError as err:
        named = re.sub(r"--[a-z][a-z0-9-]*", lambda flag: key_of_flag(flag.group(0)), err.reason)
        raise ConfigError(f"config key 'training': {named}") from None


def _training_flags(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Each key is the flag of the same name (`seqLen` is `--seq-len`), in the parser's order."""
    keys = setting_keys()
    stack_keys = [key for key, flag in keys.items() if flag not in PROGRAM_FLAGS]
    chosen: dict[str, tuple[str, list[str]]] = {}
    for key, value in raw.items():
        if key in RENAMED_TRAINING_KEYS:
            raise ConfigError(f"config key 'training.{key}' is no longer read: {RENAMED_TRAINING_KEYS[key]}")
        if key not in keys:
            hint = did_you_mean(key, [*stack_keys, *key_names(TrainingRunKeys)])
            raise ConfigError(f"unknown config key 'training.{key}': {hint}")
        flag = keys[key]
        if flag in PROGRAM_FLAGS:
            raise ConfigError(
                f"config key 'training.{key}' is set by the program ({PROGRAM_FLAGS[flag]}): remove it"
            )
        if flag in chosen:
            raise ConfigError(
                f"config keys 'training.{chosen[flag][0]}' and 'training.{key}' both set {flag}: keep one"
            )
        try:
            chosen[flag] = (key, setting_flags(key, value))
        except ArgumentsError as err:
            raise ConfigError(f"config key 'training.{key}' = {value!r}: {err.reason}") from None
        if not all(_SHELL_WORD.fullmatch(token) for token in chosen[flag][1]):
            raise ConfigError(
                f"config key 'training.{key}' = {value!r}: use letters, digits and . _ / : @ = + , - only "
                "(the job's command line passes through a shell on the cluster)"
            )
    chosen.setdefault("--preset", ("preset", ["--preset", DEFAULT_TRAINING_PRESET]))
    flags = tuple(
        token for flag in dict.fromkeys(keys.values()) if flag in chosen for token in chosen[flag][1]
    )
    training_config(flags)
    return flags


def parse_training(raw: Any) -> TrainingSettings:
    """The stack's `training` object, validated; `ConfigError` naming the key otherwise."""
    if isinstance(raw, TrainingSettings):
        return raw
    if not isinstance(raw, dict):
        raise ConfigError(
            "config key 'training' must be an object, e.g. training: {steps: 20, preset: smoke}"
        )
    run_keys = {key: value for key, value in raw.items() if key in key_names(TrainingRunKeys)}
    knobs = {key: value for key, value in raw.items() if key not in key_names(TrainingRunKeys)}
    judging = validated(TrainingRunKeys, run_keys, "training.")
    return TrainingSettings(flags=_training_flags(knobs), **judging.model_dump())


def configured_deadline(training: TrainingSettings) -> datetime | None:
    """The stack's `training.deadline`, as the job's parser reads it; None without one."""
    text = training_config(training.flags).deadline
    return datetime.fromisoformat(text) if text else None


def data_problem(data: str, shipped_files: Collection[str]) -> str | None:
    """Why the pods cannot read `--data`: they hold the shipped code (the job's working directory)
    and reach URIs, nothing of this machine's disk."""
    if data == SYNTHETIC or is_uri(data):
        return None
    path = PurePosixPath(data)
    if not path.is_absolute() and ".." not in path.parts:
        inside = path.as_posix()
        corpus = [name for name in shipped_files if name.endswith(CORPUS_SUFFIXES)]
        if any(name == inside or name.startswith(f"{inside}/") for name in corpus):
            return None
    return (
        "the pods hold only the shipped code (training/, e.g. training/corpus) and what they read from a URI; "
        "upload the corpus (aws s3 cp --recursive DIR s3://BUCKET/PREFIX/) and set training.data to its s3:// URI"
    )


@dataclass(frozen=True)
class JobUris:
    """The S3 URIs the job's flags name outside the stack's own prefixes, which the pods' role is
    granted exactly (`infra.resources.storage.job_uri_statements`): `read` (--data, --eval-data,
    --init-from, --resume-from) and `write` (--corpus-cache, which the driver fills)."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()


NO_JOB_URIS = JobUris()


def job_uris(job_args: Sequence[str], granted: Sequence[str]) -> JobUris:
    """The s3:// URIs of `job_args` not under one of the `granted` prefixes (`s3://<the stack's
    bucket>/runs`, `.../data`), each once; none for a run that names none."""

    def outside(uri: str | None) -> bool:
        return (
            bool(uri)
            and str(uri).startswith("s3://")
            and not any(
                str(uri).rstrip("/") == prefix or str(uri).startswith(f"{prefix}/") for prefix in granted
            )
        )

    config = training_config(job_args)
    read = [config.data, config.eval_data, config.init_from, config.resume_from]
    write = [config.corpus_cache]
    return JobUris(
        tuple(dict.fromkeys(str(uri) for uri in read if outside(uri))),
        tuple(dict.fromkeys(str(uri) for uri in write if outside(uri))),
    )


def job_arguments(
    training: TrainingSettings,
    world_size: int,
    gpus_per_worker: int,
    storage_path: str,
    shipped_files: Collection[str],
    line_rate_gbps: float | None = None,
    deadline: datetime | None = None,
    repaired_node_s: float | None = None,
) -> list[str]:
    """The stack's training flags plus the ones in `PROGRAM_FLAGS`.

    `world_size` is the number of training workers the GPU nodes hold (their GPUs divided by
    `gpus_per_worker`); the job uses them all unless the stack's `training.workers` asks for
    fewer. `line_rate_gbps` (the node type's, when AWS states one) lets the job's summary say what
    share of the line EFA carried. The whole command line is checked once more by the training parser, which now sees
    the worker count. `shipped_files` are the paths of the code shipped to the pods, which a
    `training.data` path must be among. `deadline` (the earlier of the reservation's usable end and
    `training.deadline`, `infra.preflight.deadline_of`) is the job's `--deadline`, in place of the
    stack's own. `repaired_node_s` (with `gpuNodeAutoRepair`: how long a node's repair and
    replacement take, `infra.aws_rules.node_repair.REPAIRED_NODE_RECOVERY_S`): a node whose faults
    repeat leaves the job (`--leave-failing-node`), and the restarts may spend that long recovering
    unless `training.recoveryBudgetS` says otherwise.
    """
    args = list(training.flags)
    if deadline is not None:
        text = parse_deadline(deadline.isoformat())
        if DEADLINE_FLAG in args:
            args[args.index(DEADLINE_FLAG) + 1] = text
        else:
            args += [DEADLINE_FLAG, text]
    workers_set = "--workers" in args
    if not workers_set:
        args += ["--workers", str(world_size)]
    args += ["--use-gpu", "--gpus-per-worker", str(gpus_per_worker), "--storage-path", storage_path]
    if repaired_node_s is not None:
        args += [LEAVE_FAILING_NODE_FLAG]
        if RECOVERY_BUDGET_FLAG not in args:
            args += [RECOVERY_BUDGET_FLAG, f"{repaired_node_s:g}"]
    if line_rate_gbps:
        args += ["--line-rate-gbps", f"{line_rate_gbps:g}"]
    try:
        config = training_config(args)
    except ConfigError as error:
        if workers_set:
            raise
        raise ConfigError(f"{error} (workers is the GPU count of the GPU nodes, {world_size})") from None
    workers = config.workers
    for key, flag, path in (("data", "--data", config.data), ("evalData", "--eval-data", config.eval_data)):
        problem = data_problem(path, shipped_files) if flag in args and path else None
        if problem:
            raise ConfigError(f"config key 'training.{key}' = {path!r}: {problem}")
    if config.corpus_cache is not None and not is_uri(config.corpus_cache):
        raise ConfigError(
            f"config key 'training.corpusCache' = {config.corpus_cache!r}: the GPU workers map the rows "
            "the driver packs there, and a pod's folder is its own; give an s3:// URI, or leave the key "
            "out to keep the cache beside the runs in the stack's bucket"
        )
    if workers is not None and workers > world_size:
        raise ConfigError(
            f"config key 'training.workers' = {workers}: the GPU nodes hold {world_size} workers of "
            f"{gpus_per_worker} GPU each; set training.workers to {world_size} or less, or add GPU nodes"
        )
    return args


def shortest_run_minutes(job_args: Sequence[str], gpu_name: str | None) -> float | None:
    """A lower bound on the job's training time: each worker's tokens times the causal FLOPs per
    token, at `MFU_CEILING` of one GPU's bf16 peak. None for a model or GPU without known numbers.

    A bound, not the planner's prediction (`infra.planner`, which the preview logs beside it): the
    warning says a run cannot finish in time, so it must not fire on the planner's modelling error."""
    config = training_config(job_args)
    peak = peak_flops(gpu_name)
    if peak is None or not (CONFIG_DIR / f"{config.model_config}.json").is_file():
        return None
    model = load_model_config(config.model_config)
    tokens = config.steps * config.grad_accum_steps * config.batch_size * config.seq_len
    return tokens * flops_per_token(model, config.seq_len, causal=True) / (peak * MFU_CEILING) / 60


def warn_if_the_run_outlasts_its_timeout(
    training: TrainingSettings, job_args: Sequence[str], gpu_name: str | None
) -> None:
    """`pulumi up` follows the job for `timeoutMinutes`, then leaves it running; say so at preview
    when even a perfect run takes longer."""
    minutes = shortest_run_minutes(job_args, gpu_name)
    if minutes is not None and minutes > training.timeout_minutes:
        pulumi.log.warn(
            f"config key 'training.timeoutMinutes' = {training.timeout_minutes}: the job needs at least "
            f"{minutes:.0f} minutes on {gpu_name} GPUs (its FLOPs at {MFU_CEILING:.0%} MFU), so `pulumi up` "
            "will stop following it and leave it running: raise timeoutMinutes or lower training.steps"
        )
