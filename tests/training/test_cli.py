"""`python -m training` as a person meets it: --help, bad values, and the expected failures
(no cluster, no GPU, no access to the Hugging Face Hub) as one line without a traceback."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys

import pytest

from infra.config.training_settings import key_of_flag, setting_flags, setting_keys
from tests.harness.paths import REPO_ROOT
from training.config.run_config import (
    PRESETS,
    ArgumentsError,
    TrainConfig,
    build_parser,
    parse_args,
    parse_flags,
)

TIMEOUT_S = 120


def run_training(*args: str, env: dict[str, str] | None = None, launcher: list[str] | None = None):
    environment = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    environment.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [*(launcher or [sys.executable]), "-m", "training", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment,
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The run failed with exit 2 and exactly one line on stderr (no traceback, no usage)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("python -m training: error: ")
    return lines[0]


def help_of(flag: str) -> str:
    action = next(action for action in build_parser()._actions if flag in action.option_strings)
    return action.help or ""


def test_help_shows_each_flags_effective_default_not_none():
    text = build_parser().format_help()
    assert "(default: None)" not in text
    assert "default: 128; --preset throughput: 4096" in help_of("--seq-len")
    assert "default: 30; --preset smoke: 5; --preset throughput: 50" in help_of("--steps")
    assert "default: training/corpus; --preset smoke: synthetic" in help_of("--data")
    assert "default: 2; --preset smoke: one per GPU of the cluster" in help_of("--workers")
    assert "(default: runs)" in help_of("--storage-path")
    # Every setting a preset sets states its default.
    for action in build_parser()._actions:
        if action.dest in PRESETS["tiny"]:
            assert "(default: " in (action.help or ""), action.dest


def test_each_setting_is_one_field_with_its_flag_and_every_preset_fills_it():
    """The parser is derived from `TrainConfig`: one flag per field, in the field's order, and a
    preset gives every field a value but the run's own (preset, --local, its folder)."""
    fields = [field.name for field in dataclasses.fields(TrainConfig)]
    dests = [action.dest for action in build_parser()._actions if action.dest != "help"]
    assert dests == fields
    run_level = {"preset", "local", "storage_path", "run_name"}
    for name, preset in PRESETS.items():
        assert set(preset) == set(fields) - run_level, name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seq-len", "abc"], "argument --seq-len: expected a whole number >= 1, got 'abc'"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (
            ["--steps", "100000000000000000000"],
            "argument --steps: must be <= 10_000_000, got 100000000000000000000",
        ),
        (["--lr", "fast"], "argument --lr/--learning-rate: expected a number > 0, got 'fast'"),
        (["--seed", "x"], "argument --seed: expected a whole number, got 'x'"),
        (["--hsdp-replicas", "two"], "argument --hsdp-replicas: expected 'auto' or a count >= 1, got 'two'"),
        (["--grad-accum-steps", "0"], "argument --grad-accum-steps: must be >= 1, got 0"),
        (
            ["--grad-accum-steps", "abc"],
            "argument --grad-accum-steps: expected a whole number >= 1, got 'abc'",
        ),
    ],
)
def test_a_bad_value_names_the_flag_and_what_it_expects(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    error = capsys.readouterr().err
    assert message in error and "invalid" not in error
    # The usage text, then one line that says what is wrong.
    assert [line for line in error.splitlines() if "error:" in line] == [
        f"python -m training: error: {message}"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--unknown-flag"],
        ["--data", "/no/such/corpus"],
        ["--workers", "6", "--hsdp-replicas", "4"],
    ],
)
def test_parse_flags_raises_what_the_cli_prints(argv, capsys):
    """The Pulumi program checks a job's flags with `parse_flags`: the same message, no exit."""
    with pytest.raises(ArgumentsError) as raised:
        parse_flags(argv)
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert f"python -m training: error: {raised.value}" in capsys.readouterr().err


def test_flags_for_another_machine_leave_its_paths_alone():
    """At preview the corpus and the checkpoint are the cluster's paths: not looked up here."""
    argv = ["--data", "/no/such/corpus", "--resume-from", "runs/earlier", "--storage-path", "runs"]
    config = parse_flags(argv, paths_here=False)
    assert (config.data, config.resume_from, config.storage_path) == (
        "/no/such/corpus",
        "runs/earlier",
        "runs",
    )
    with pytest.raises(ArgumentsError, match=r"--resume-from .*runs/earlier': not a checkpoint folder"):
        parse_flags(argv)
    with pytest.raises(ArgumentsError, match="--data '/no/such/corpus': no such file or folder"):
        parse_flags(argv[:2])
    # A shipped architecture travels with the code, so its limits are checked anywhere.
    with pytest.raises(ArgumentsError, match="exceeds the model's max_position_embeddings"):
        parse_flags(["--init", "random", "--model-config", "tiny", "--seq-len", "100000"], paths_here=False)


def test_every_flag_has_a_camel_case_key():
    keys = setting_keys()
    assert (keys["seqLen"], keys["hsdpReplicas"], keys["exportHf"]) == (
        "--seq-len",
        "--hsdp-replicas",
        "--export-hf",
    )
    assert keys["learningRate"] == keys["lr"] == "--lr" and keys["gpu"] == keys["useGpu"] == "--use-gpu"
    assert keys["gradAccumSteps"] == "--grad-accum-steps"
    assert "help" not in keys and "noCompile" not in keys
    flags = {flag for action in build_parser()._actions for flag in action.option_strings}
    long_flags = {flag for flag in flags if flag.startswith("--") and flag != "--help"}
    assert {key_of_flag(flag) for flag in long_flags if not flag.startswith("--no-")} == set(keys)


@pytest.mark.parametrize(
    ("key", "value", "flags"),
    [
        ("seqLen", 256, ["--seq-len", "256"]),
        ("learningRate", 1e-4, ["--lr", "0.0001"]),
        ("hsdpReplicas", "auto", ["--hsdp-replicas", "auto"]),
        ("compile", True, ["--compile"]),
        ("compile", "false", ["--no-compile"]),
        ("maxFailures", -1, ["--max-failures", "-1"]),
        ("gradAccumSteps", 4, ["--grad-accum-steps", "4"]),
        ("local", False, []),
        ("deadline", "2026-12-05T07:00:00Z", ["--deadline", "2026-12-05T07:00:00Z"]),
    ],
)
def test_a_setting_becomes_its_flags(key, value, flags):
    assert setting_flags(key, value) == flags


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("seqLen", 0, "must be >= 1, got 0"),
        ("gradAccumSteps", 0, "must be >= 1, got 0"),
        ("gradAccumSteps", "abc", "expected a whole number >= 1, got 'abc'"),
        ("compile", 1, "expected true or false, got 1"),
        ("steps", False, "expected a single value, got False"),
        ("init", "zeros", "invalid choice: 'zeros'"),
        ("lr", "inf", "expected a finite number, got 'inf'"),
        ("lr", "nan", "expected a finite number, got 'nan'"),
        ("maxGradNorm", "1e999", "expected a finite number, got '1e999'"),
        ("runName", "../other", "expected a folder name of letters, digits and . _ -"),
        ("deadline", "2026-12-05 07:00", "'2026-12-05 07:00' has no UTC offset"),
    ],
)
def test_a_bad_setting_names_what_its_flag_expects(key, value, reason):
    with pytest.raises(ArgumentsError) as raised:
        setting_flags(key, value)
    assert raised.value.reason.startswith(reason)


def test_without_local_or_ray_address_is_one_line_and_joins_no_ray_on_the_machine(tmp_path):
    """Whatever Ray runs on this machine (another user's embedded one), no address means no join,
    and no run folder is left behind."""
    line = one_line_error(run_training("--steps", "1", "--storage-path", str(tmp_path / "runs")))
    assert "no Ray cluster given" in line and "RAY_ADDRESS" in line and "--local" in line
    assert not (tmp_path / "runs").exists()


def test_a_deadline_already_past_is_one_line_before_ray_starts(tmp_path):
    line = one_line_error(
        run_training(
            "--local", "--deadline", "2020-01-01T00:00:00Z", "--storage-path", str(tmp_path / "runs")
        )
    )
    assert "--deadline 2020-01-01T00:00:00Z is past" in line and "pass a later time" in line
    assert not (tmp_path / "runs").exists()


def test_a_deadline_without_utc_offset_is_refused_at_parse():
    """argparse's usage and error line, exit 2, as every bad flag value."""
    result = run_training("--deadline", "2026-12-05T07:00:00")
    assert result.returncode == 2
    assert (
        "error: argument --deadline: '2026-12-05T07:00:00' has no UTC offset: end it with Z" in result.stderr
    )


def test_a_ray_address_nobody_answers_is_one_line_naming_it():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused at once
        line = one_line_error(run_training("--steps", "1", env={"RAY_ADDRESS": address}))
    assert f"RAY_ADDRESS={address}: no Ray cluster answers there" in line and "--local" in line


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_a_model_the_hub_cannot_deliver_is_one_line(launcher, tmp_path):
    """HF_HUB_OFFLINE with an empty cache: huggingface_hub's documented offline mode, the
    situation of a machine without access to the Hub."""
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    args = ["--preset", "smoke", "--no-gpu", "--workers", "1", "--steps", "1"]
    if launcher == "ray":
        result = run_training("--local", *args, env=offline)
    else:  # one rank, as torchrun would start it
        rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        result = run_training("--launcher", "torchrun", *args, env={**offline, **rank})
    line = one_line_error(result)
    assert "--model-id Qwen/Qwen2.5-1.5B" in line and "--init random" in line


@pytest.mark.slow
def test_a_gpu_preset_without_a_gpu_under_torchrun_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    result = run_training("--launcher", "torchrun", "--preset", "smoke", "--init", "random", env=rank)
    line = one_line_error(result)
    assert "--preset smoke trains on GPUs" in line and "--no-gpu" in line


def test_float8_without_gpus_is_refused_at_parse(capsys):
    """The default preset trains on CPU workers, which have no FP8 tensor cores."""
    with pytest.raises(SystemExit):
        parse_args(["--float8"])
    assert (
        "--float8 needs GPUs with FP8 tensor cores; it does not combine with --no-gpu"
        in capsys.readouterr().err
    )
    assert parse_flags(["--preset", "throughput", "--float8"]).float8


def test_flex_attention_without_gpus_is_refused_at_parse():
    """FlexAttention has no backward on the CPU (torch raises NotImplementedError mid-step)."""
    with pytest.raises(ArgumentsError, match=r"^--attention flex needs GPUs: .*use --attention sdpa$"):
        parse_flags(["--attention", "flex"])
    assert parse_flags(["--preset", "throughput", "--attention", "flex"]).attention == "flex"


@pytest.mark.parametrize(
    ("argv", "kernel", "documents"),
    [
        # The GPU default: every document of a corpus isolated, with FlexAttention.
        (["--preset", "throughput", "--data", "training/corpus"], "flex", "isolated"),
        (["--preset", "smoke", "--data", "training/corpus"], "flex", "isolated"),
        # A user can still ask for packing; causal rows keep cuDNN's causal SDPA kernel.
        (
            ["--preset", "throughput", "--data", "training/corpus", "--document-attention", "packed"],
            "sdpa",
            "packed",
        ),
        (["--preset", "throughput"], "sdpa", "isolated"),  # synthetic tokens have no documents
        (["--preset", "throughput", "--data", "training/corpus", "--attention", "sdpa"], "sdpa", "isolated"),
        # The CPU: SDPA (FlexAttention has no backward there), conversations alone isolated.
        (["--preset", "tiny"], "sdpa", "auto"),
        (["--preset", "throughput", "--data", "training/corpus", "--no-gpu"], "sdpa", "auto"),
    ],
)
def test_isolated_documents_with_flex_are_the_gpu_default(argv, kernel, documents):
    config = parse_flags(argv)
    assert (config.wanted_attention, config.packing_attention) == (kernel, documents)


def test_every_preset_leaves_the_attention_to_auto():
    assert {(p["attention"], p["document_attention"]) for p in PRESETS.values()} == {("auto", "auto")}


def test_the_stack_trains_isolated_documents_with_flex_by_default():
    """The stack's `training` keys are the job's flags: left out, they take the same defaults."""
    from infra.config.training_settings import job_arguments, parse_training

    settings = parse_training({"preset": "throughput", "data": "training/corpus"})
    args = job_arguments(settings, 8, 1, "s3://bucket/runs", ["training/corpus/a.txt"])
    config = parse_flags(args, paths_here=False)
    assert (config.wanted_attention, config.packing_attention) == ("flex", "isolated")
    packed = parse_training(
        {"preset": "throughput", "data": "training/corpus", "documentAttention": "packed"}
    )
    config = parse_flags(job_arguments(packed, 8, 1, "s3://b/r", ["training/corpus/a.txt"]), paths_here=False)
    assert (config.wanted_attention, config.packing_attention) == ("sdpa", "packed")


def test_deferred_grad_sync_without_accumulation_is_refused_at_parse():
    """With one micro-batch per step there is no reduce to defer: the flag would do nothing."""
    with pytest.raises(ArgumentsError, match=r"--defer-grad-sync .*set --grad-accum-steps > 1"):
        parse_flags(["--defer-grad-sync"])
    config = parse_flags(["--grad-accum-steps", "4", "--defer-grad-sync"])
    assert (config.grad_accum_steps, config.defer_grad_sync) == (4, True)
    assert setting_flags("deferGradSync", True) == ["--defer-grad-sync"]


def test_more_local_cpu_workers_than_cpus_is_one_line(tmp_path):
    workers = max(os.cpu_count() or 1, 2) + 1
    line = one_line_error(run_training("--local", "--workers", str(workers), "--storage-path", str(tmp_path)))
    assert f"--local --workers {workers}: this machine has {os.cpu_count()} CPUs" in line


@pytest.mark.parametrize("text", ["{bad", "[1, 2]"])
def test_a_model_config_file_that_is_no_json_object_is_one_line_naming_flag_and_file(tmp_path, text):
    bad = tmp_path / "model.json"
    bad.write_text(text)
    result = run_training("--local", "--model-config", str(bad), "--storage-path", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the usage text, as for every bad flag
    assert last.startswith(f"python -m training: error: --model-config {bad}: {bad}")


# A `sitecustomize` for the child `python -m training`, found through PYTHONPATH: when the child
# imports training.loop, it wraps `build` (as test_loop.py's in-process tests do) so that from the
# model's second forward on the loss stays finite and its gradient, so every weight's, is NaN.
POISONED_GRADIENTS = """
import importlib.abc
import importlib.util
import itertools
import math
import sys


def poison(loop):
    build, forwards = loop.build, itertools.count(1)

    def poison_gradients(module, args, loss):
        if next(forwards) >= 2:
            loss.register_hook(lambda grad: grad * math.nan)

    def build_and_poison(config, session, **options):
        parts = build(config, session, **options)
        parts[0].register_forward_hook(poison_gradients)
        return parts

    loop.build = build_and_poison


class PoisonOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "training.loop":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            poison(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, PoisonOnImport())
"""


def diverging_run(tmp_path, lr: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """One torchrun rank, 4 steps at `lr` checkpointing every step, that must fail: its one stderr
    line (exit 1, no traceback) and the checkpoints it left."""
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    flags = ["--data", "synthetic", "--seq-len", "32", "--batch-size", "2", "--lr", lr, "--warmup-steps", "0"]
    storage = tmp_path / "runs"
    result = run_training(
        "--launcher", "torchrun", *flags, "--steps", "4", "--checkpoint-every", "1",
        "--storage-path", str(storage), "--run-name", "diverged", env={**rank, **(env or {})},
    )  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    return lines[0], sorted(path.name for path in (storage / "diverged").glob("checkpoint_*"))


def test_a_run_whose_gradients_go_non_finite_exits_1_in_one_line_without_that_steps_checkpoint(tmp_path):
    """Step 2's loss is finite, its gradient norm NaN (POISONED_GRADIENTS makes it so in the child):
    the run stops there, before step 2's optimizer step and checkpoint, instead of ending with rc 0."""
    shim = tmp_path / "poisoned_gradients"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(POISONED_GRADIENTS)
    python_path = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
    line, checkpoints = diverging_run(tmp_path, "3e-3", env={"PYTHONPATH": python_path})
    assert line.startswith("training failed: step 2: the gradient norm is nan;"), line
    assert "Lower --lr (this step's: 0.003)" in line
    assert checkpoints == ["checkpoint_000001"]


def test_a_run_at_lr_1e30_exits_1_in_one_line_at_step_2_without_that_steps_checkpoint(tmp_path):
    """Step 1's update blows the weights up; at step 2 the forward or the backward overflows,
    whichever the CPU's floating-point path reaches first, so either quantity may be the one named."""
    line, checkpoints = diverging_run(tmp_path, "1e30")
    assert re.match(r"training failed: step 2: the (loss|gradient norm) is (nan|-?inf); ", line), line
    assert "Lower --lr (this step's: 1e+30)" in line
    assert checkpoints == ["checkpoint_000001"]


@pytest.mark.parametrize("launcher", [pytest.param("ray", marks=pytest.mark.slow), "torchrun"])
def test_a_corpus_row_without_text_is_one_line_naming_file_line_and_columns(launcher, tmp_path):
    """Read by a Ray Data task (ray) or by the rank itself (torchrun): the same line, exit 2."""
    corpus = tmp_path / "rows.jsonl"
    corpus.write_text('{"text": "a good document"}\n{"id": 7, "body": "no text"}\n')
    args = ["--data", str(corpus), "--steps", "1", "--storage-path", str(tmp_path / "runs")]
    if launcher == "ray":
        result = run_training("--local", *args)
    else:  # one rank, as torchrun would start it
        rank = {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "0",
        }
        result = run_training("--launcher", "torchrun", *args, env=rank)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [
        line for line in result.stderr.splitlines() if line.strip() and "Started a local Ray" not in line
    ]
    assert lines == [
        f"python -m training: error: corpus file {corpus} line 2: no 'text' column; the row's columns: 'id', 'body'"
    ]
