"""The stack's `training` block (`infra.config.training_settings`): every flag of `python -m training` is
a key, the program's own flags are refused, and bad values name the key inside the block."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from infra.config.stack import ConfigError
from infra.config.training_settings import (
    PROGRAM_FLAGS,
    JobUris,
    job_uris,
    key_of_flag,
    setting_flags,
    setting_keys,
)
from tests.harness.stack_values import parse
from training.config.run_config import PRESETS, build_parser, parse_flags


@pytest.mark.parametrize(
    "key, suggestion",
    [
        ("setps", "steps"),
        ("seq_len", "seqLen"),
        ("learningrate", "learningRate"),
        ("hsdpReplica", "hsdpReplicas"),
        ("timeoutMinute", "timeoutMinutes"),
    ],
)
def test_misspelt_training_key_is_named_with_its_object(key, suggestion):
    with pytest.raises(
        ConfigError, match=f"unknown config key 'training.{key}': did you mean '{suggestion}'"
    ):
        parse(training=json.dumps({key: 3}))


def test_the_former_hsdp_key_points_to_hsdp_replicas():
    with pytest.raises(ConfigError) as raised:
        parse(training='{"hsdp": true}')
    message = str(raised.value)
    assert message.startswith("config key 'training.hsdp' is no longer read: ")
    assert "hsdpReplicas: auto" in message and "hsdpReplicas: 1" in message and "\n" not in message


@pytest.mark.parametrize("key", [*(key_of_flag(flag) for flag in PROGRAM_FLAGS), "gpu"])
def test_flags_the_program_sets_are_refused(key):
    flag = setting_keys()[key]
    value = True if flag in ("--use-gpu", "--local") else "1"
    with pytest.raises(
        ConfigError, match=rf"config key 'training\.{key}' is set by the program \(.+\): remove it"
    ):
        parse(training=json.dumps({key: value}))


# Keys whose values are only valid beside another key's (the job refuses them alone).
COMPANIONS = {"deferGradSync": {"gradAccumSteps": 2}}


def example_values(key: str, flag: str) -> list:
    """Values `flag` accepts, as a stack would write them: its presets' values that the stack
    accepts (a preset may hold a value in its internal form, a path may hold a space), else a
    plain word."""
    action = next(action for action in build_parser()._actions if flag in action.option_strings)
    if action.nargs == 0:
        return [True, False]
    if action.choices:
        return list(action.choices)
    in_presets = dict.fromkeys(preset.get(action.dest) for preset in PRESETS.values())
    shaped = SHAPED_EXAMPLES.get(key, ["example"])
    return [value for value in in_presets if value is not None and accepted(key, value)] or shaped


# Keys whose values have a shape a plain word does not meet.
SHAPED_EXAMPLES = {"deadline": ["2099-01-01T00:00:00Z"]}


def accepted(key: str, value) -> bool:
    try:
        parse(training=json.dumps({key: value, **COMPANIONS.get(key, {})}))
    except ConfigError:
        return False
    return True


def test_every_training_flag_is_a_stack_key():
    """Adding a flag to `python -m training` makes it a `training:` key with no other edit: each
    flag the program does not set, written as its camelCase key, gives the job what the flag
    gives on the command line."""
    stack_flags = {flag for flag in setting_keys().values() if flag not in PROGRAM_FLAGS}
    assert {"--steps", "--seq-len", "--hsdp-replicas", "--compile", "--data", "--model-id"} <= stack_flags
    for key, flag in setting_keys().items():
        if flag in PROGRAM_FLAGS:
            continue
        assert key_of_flag(flag) == key or flag == "--lr"  # --lr also answers to --learning-rate
        companions = COMPANIONS.get(key, {})
        for value in example_values(key, flag):
            training = parse(training=json.dumps({key: value, **companions})).training
            cli = [
                *setting_flags(key, value),
                *(extra for other, given in companions.items() for extra in setting_flags(other, given)),
            ]
            on_the_command_line = parse_flags(["--preset", "smoke", *cli], paths_here=False)
            from_the_stack = parse_flags(training.flags, paths_here=False)
            assert replace(from_the_stack, run_name="") == replace(on_the_command_line, run_name=""), key
            dest = next(a.dest for a in build_parser()._actions if flag in a.option_strings)
            if dest != "preset":
                # On a GPU preset: the default (tiny) is CPU-only, which --float8 refuses.
                alone = parse_flags(["--preset", "throughput", *cli], paths_here=False)
                assert getattr(from_the_stack, dest) == getattr(alone, dest), key


def test_deferred_grad_sync_alone_fails_preview_naming_both_keys():
    with pytest.raises(ConfigError, match=r"deferGradSync defers .*: set gradAccumSteps > 1"):
        parse(training=json.dumps({"deferGradSync": True}))


@pytest.mark.parametrize("name", ["../other-run", "..", ".", "runs/exp1", "-exp1", "e" * 129])
def test_a_run_name_that_is_not_one_folder_is_refused(name):
    with pytest.raises(ConfigError, match=r"'training\.runName'"):
        parse(training={"runName": name})


def test_the_jobs_uris_outside_the_stacks_prefixes_are_named_once_each_by_what_the_job_does_there():
    granted = ["s3://stack-bucket/runs", "s3://stack-bucket/data"]
    args = [
        *("--data", "s3://other/text/", "--eval-data", "s3://stack-bucket/data/held-out.jsonl"),
        *("--init-from", "s3://other/text/", "--corpus-cache", "s3://cache/packed"),
        *("--storage-path", "s3://stack-bucket/runs", "--workers", "2"),
    ]
    assert job_uris(args, granted) == JobUris(read=("s3://other/text/",), write=("s3://cache/packed",))
    # The standing grants cover the stack's own prefixes, and a local corpus reaches no bucket.
    assert job_uris(["--data", "s3://stack-bucket/data/", "--workers", "2"], granted) == JobUris()
    assert job_uris(["--data", "synthetic", "--workers", "2"], granted) == JobUris()
    # A prefix that merely starts like a granted one is another prefix.
    assert job_uris(["--data", "s3://stack-bucket/datasets/x", "--workers", "2"], granted).read == (
        "s3://stack-bucket/datasets/x",
    )
