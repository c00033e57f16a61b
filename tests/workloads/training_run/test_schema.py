"""The run schema: the job arguments from the stack, `check` of the inputs, what is part of them, the time limits."""

from __future__ import annotations

import json
from dataclasses import replace

import pulumi
import pytest
from pulumi.runtime import rpc

from infra.aws_rules.node_repair import REPAIRED_NODE_RECOVERY_S
from infra.config.stack import ConfigError, parse_settings
from infra.config.training_settings import PROGRAM_FLAGS, TrainingSettings, job_arguments
from tests.harness.paths import REPO_ROOT
from tests.harness.program import STACK_FILES, config_of, stack_name
from tests.harness.training_run_fakes import props, run_inputs
from training.config.run_config import parse_args
from workloads import manifests
from workloads.training_run import (
    errors,
    provider,
    schema,
)

SHIPPED = tuple(manifests.collect_code(REPO_ROOT))


def stack_training(block: dict) -> TrainingSettings:
    """A stack's `training:` block as the program reads it."""
    raw = {"endpointPublicAccessCidrs": '["203.0.113.7/32"]', "training": json.dumps(block)}
    return parse_settings(raw, "us-east-2", stack="dev").training


def test_job_arguments_are_the_stack_flags_and_the_program_flags():
    training = stack_training(
        {
            "preset": "throughput",
            "modelId": "Qwen/Qwen2.5-0.5B",
            "init": "random",
            "steps": 20,
            "seqLen": 4096,
            "batchSize": 2,
            "learningRate": 3e-5,
            "workers": 4,
            "checkpointEvery": 10,
            "hsdpReplicas": "auto",
            "compile": False,
            "expectTransport": "socket",
        }
    )
    args = job_arguments(
        training, world_size=8, gpus_per_worker=1, storage_path="s3://bucket/runs", shipped_files=SHIPPED
    )
    assert args == [
        *("--preset", "throughput", "--steps", "20", "--seq-len", "4096", "--batch-size", "2"),
        *("--lr", "3e-05", "--workers", "4", "--model-id", "Qwen/Qwen2.5-0.5B", "--init", "random"),
        *("--checkpoint-every", "10", "--hsdp-replicas", "auto", "--no-compile"),
        *("--use-gpu", "--gpus-per-worker", "1", "--storage-path", "s3://bucket/runs"),
    ]


def test_job_arguments_default_to_every_gpu_and_leave_unset_settings_to_the_preset():
    for preset, hsdp_replicas in (("smoke", 1), ("throughput", 0)):
        args = job_arguments(
            stack_training({"preset": preset}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/runs",
            shipped_files=SHIPPED,
        )
        assert args[args.index("--workers") + 1] == "8"
        for flag in ("--steps", "--seq-len", "--batch-size", "--lr", "--checkpoint-every", "--hsdp-replicas"):
            assert flag not in args
        assert parse_args(args).hsdp_replicas == hsdp_replicas


def test_job_arguments_parse_with_the_training_cli():
    """Every flag exists in `python -m training`, the values survive its validation, and the flags
    the program owns have the values the cluster needs."""
    training = stack_training(
        {
            "steps": 7,
            "seqLen": 256,
            "batchSize": 2,
            "learningRate": 1e-4,
            "workers": 6,
            "hsdpReplicas": "auto",
        }
    )
    config = parse_args(
        job_arguments(
            training,
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/runs",
            shipped_files=SHIPPED,
            line_rate_gbps=40.0,
        )
    )
    assert (config.preset, config.steps, config.seq_len, config.batch_size, config.lr) == (
        "smoke",
        7,
        256,
        2,
        1e-4,
    )
    assert (config.workers, config.use_gpu, config.gpus_per_worker, config.hsdp_replicas) == (6, True, 1.0, 0)
    assert config.storage_path == "s3://b/runs"
    assert (config.local, config.launcher, config.line_rate_gbps) == (False, "ray", 40.0)
    assert set(PROGRAM_FLAGS) == {
        "--storage-path",
        "--use-gpu",
        "--gpus-per-worker",
        "--local",
        "--launcher",
        "--line-rate-gbps",
        "--leave-failing-node",
    }


def test_with_auto_repair_a_failing_node_leaves_the_job_within_a_repairs_recovery_budget():
    """gpuNodeAutoRepair: the job takes a node out rather than ending, and its restarts may wait for the
    node's repair and replacement, unless the stack sets its own budget."""
    for keys, budget in (({}, 3000.0), ({"recoveryBudgetS": 900}, 900.0)):
        args = job_arguments(
            stack_training(keys), 8, 1, "s3://b/runs", SHIPPED, repaired_node_s=REPAIRED_NODE_RECOVERY_S
        )
        config = parse_args(args)
        assert (config.leave_failing_node, config.recovery_budget_s) == (True, budget)
    plain = parse_args(job_arguments(stack_training({}), 8, 1, "s3://b/runs", SHIPPED))
    assert (plain.leave_failing_node, plain.recovery_budget_s) == (False, 1800.0)


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda path: path.stem.split(".", 1)[1])
def test_stack_files_run_the_job_they_ran_before(stack_file):
    """The flags the program passed before the stack's `training:` keys became flags of the
    training parser (preset smoke, 20 steps, 2 x g6.12xlarge) give the same job."""
    before = [
        *("--preset", "smoke", "--model-id", "Qwen/Qwen2.5-1.5B", "--init", "pretrained", "--workers", "8"),
        *("--use-gpu", "--gpus-per-worker", "1", "--hsdp-replicas", "1", "--storage-path", "s3://b/runs"),
        *("--steps", "20"),
    ]
    config = config_of(stack_file)
    settings = parse_settings(
        {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith("eks-ray-train:")},
        config["aws:region"],
        stack=stack_name(stack_file),
    )
    now = job_arguments(
        settings.training, world_size=8, gpus_per_worker=1, storage_path="s3://b/runs", shipped_files=SHIPPED
    )
    assert now == [
        *("--preset", "smoke", "--steps", "20", "--workers", "8"),
        *("--use-gpu", "--gpus-per-worker", "1", "--storage-path", "s3://b/runs"),
    ]
    assert replace(parse_args(now), run_name="") == replace(parse_args(before), run_name="")


def test_job_arguments_refuse_more_workers_than_gpus():
    with pytest.raises(ConfigError, match=r"'training.workers' = 9.*hold 8 workers"):
        job_arguments(
            stack_training({"workers": 9}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )


def test_job_arguments_check_the_worker_count_against_the_stack_settings():
    with pytest.raises(ConfigError) as raised:
        job_arguments(
            stack_training({"hsdpReplicas": 3}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )
    assert str(raised.value) == (
        "config key 'training': 8 workers are not a multiple of hsdpReplicas 3 "
        "(workers is the GPU count of the GPU nodes, 8)"
    )


def test_check_accepts_good_inputs_and_unknown_values_of_a_preview():
    checker = provider.TrainingRunProvider()
    good = props(run_inputs())
    assert checker.check({}, good).failures == []
    for unknown in (rpc.UNKNOWN, pulumi.output.Unknown()):  # the wire form, and what the host hands over
        preview = {**good, "code_hash": unknown, "job_args": unknown, "run_spec_hash": unknown}
        assert checker.check({}, preview).failures == []
        inside = {**good, "job_args": [*good["job_args"], "--steps", unknown]}
        assert checker.check({}, inside).failures == []


@pytest.mark.parametrize(
    "value",
    [
        ["--steps", pulumi.output.Unknown()],
        ("--steps", rpc.UNKNOWN),
        [["--steps", pulumi.output.Unknown()]],
        {"steps": [1, {"at": rpc.UNKNOWN}]},
    ],
    ids=["list-element", "tuple-sentinel", "nested-list", "map-in-list-in-map"],
)
def test_a_value_holding_an_unknown_at_any_depth_is_not_known(value):
    assert not schema.is_known(value)


def test_a_null_element_is_known_and_refused():
    """Only the engine's unknowns pass unchecked: a null inside a list is a value, and a wrong one."""
    assert schema.is_known(["--steps", None])
    assert schema.input_problems({**props(run_inputs()), "job_args": ["--steps", None]}) == [
        ("job_args", "must be a list of strings (flags of `python -m training`)")
    ]


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("gpus_per_node", 0, "at least 1"),
        ("gpus_per_node", 2.5, "whole number"),
        ("efa_per_node", 0, "efa transport needs at least 1 EFA"),
        ("line_rate_gbps", -1, "positive number"),
        ("min_busbw_fraction", 2, "from 0 to 1"),
        ("job_args", "--steps 5", "list of strings"),
        ("expect_transport", "tcp", "one of efa, socket, ib, intra-node"),
        ("expect_transport", "unknown", "one of efa, socket, ib, intra-node"),
        ("timeout_minutes", 0, "at least 1"),
        ("cluster_name", "", "non-empty"),
        ("benchmark", "yes", "true or false"),
        ("not_before", "2026-12-05T11:30:00", "with its UTC offset"),
        ("not_before", "at 11:30", "ISO 8601 time"),
        ("deadline_check", {"key": "training.deadline", "value": "x", "fix": "y"}, "positive least_s"),
        (
            "deadline_check",
            {"key": "gpuAz", "value": "x", "fix": "y", "least_s": 90.0},
            "training.deadline or",
        ),
        ("deadline_check", {"key": "training.deadline", "value": "x", "fix": "y", "least_s": 0}, "positive"),
        ("planned", {"usd_per_gpu_node_hour": 4.6, "step_time_s": 1.2}, "price_basis and, where known"),
    ],
)
def test_check_names_the_bad_input(key, value, reason):
    failures = provider.TrainingRunProvider().check({}, {**props(run_inputs()), key: value}).failures
    assert [(f.property, reason in f.reason) for f in failures] == [(key, True)]


def test_check_requires_every_input():
    inputs = props(run_inputs())
    del inputs["code_hash"]
    failures = provider.TrainingRunProvider().check({}, inputs).failures
    assert [(f.property, f.reason) for f in failures] == [("code_hash", "is required")]


def test_no_efa_is_fine_when_efa_is_not_expected():
    assert (
        schema.input_problems({**props(run_inputs()), "efa_per_node": 0, "expect_transport": "socket"}) == []
    )


def _registered_run(**settings: str) -> dict:
    from tests.harness.program import dev_config, run_program

    return run_program(dev_config(**settings)).one("pulumi-python:dynamic/workloads:TrainingRun").inputs


@pytest.mark.slow
def test_a_change_of_what_the_pods_run_changes_the_inputs_so_the_job_runs_again():
    """Image, NCCL/EFA environment, resources (all in the rendered RayCluster) and instance type."""
    base = _registered_run()
    image = _registered_run(image="public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.2")
    other_gpu = _registered_run(gpuNodeType="g5.12xlarge")
    assert image["run_spec_hash"] != base["run_spec_hash"] and image["code_hash"] == base["code_hash"]
    assert other_gpu["gpu_instance_type"] == "g5.12xlarge" != base["gpu_instance_type"]
    olds = {**base, "job_id": "eks-ray-train-main-0123456789ab"}
    assert provider.diff_props(olds, image).replaces == ["run_spec_hash"]
    assert "gpu_instance_type" in provider.diff_props(olds, other_gpu).replaces


def test_run_timings_come_from_the_environment_and_refuse_nonsense():
    timings = schema.RunTimings.from_env(
        {"EKS_RAY_TRAIN_API_ATTEMPTS": "5", "EKS_RAY_TRAIN_POLL_INTERVAL_S": "0.5"}
    )
    assert (timings.api.attempts, timings.poll_interval_s, timings.readiness_timeout_s) == (5, 0.5, 1200)
    with pytest.raises(
        errors.TrainingRunError, match="EKS_RAY_TRAIN_API_READ_TIMEOUT_S='soon': must be a positive"
    ):
        schema.RunTimings.from_env({"EKS_RAY_TRAIN_API_READ_TIMEOUT_S": "soon"})


@pytest.mark.parametrize(
    "data",
    [
        "synthetic",
        "s3://bucket/corpus/",
        "training/corpus",
        "./training/corpus/",
        "training/corpus/bread.txt",
    ],
)
def test_job_data_the_pods_can_read_is_accepted(data):
    args = job_arguments(
        stack_training({"data": data}),
        world_size=8,
        gpus_per_worker=1,
        storage_path="s3://b/r",
        shipped_files=SHIPPED,
    )
    assert args[args.index("--data") + 1] == data


@pytest.mark.parametrize(
    "data", ["/home/me/corpus", "../corpus", "corpus", "training/config/run_config.py", "training/nowhere"]
)
def test_job_data_only_this_machine_has_is_refused(data):
    with pytest.raises(
        ConfigError, match=r"config key 'training\.data' = .*: the pods hold only the shipped code"
    ):
        job_arguments(
            stack_training({"data": data}),
            world_size=8,
            gpus_per_worker=1,
            storage_path="s3://b/r",
            shipped_files=SHIPPED,
        )
