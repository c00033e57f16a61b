"""Fast unit tests of the training package: FLOPs/MFU, log lines, loss, data, configuration, CLI."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.harness.packing_reference import corpus_rows, local_corpus_batches
from training.components.optim import learning_rate
from training.config.run_config import (
    CONFIG_DIR,
    PACKAGE_DIR,
    PRESETS,
    SHIPPED_CORPUS,
    SYNTHETIC,
    load_model_config,
    parse_args,
)
from training.data.packing import pack_documents, read_documents, synthetic_batches
from training.data.tokenizer import ByteTokenizer
from training.distributed.parallelize import replica_groups
from training.metrics import flops, report
from training.model.loss import (
    IGNORE_INDEX,
    chunk_loss_and_logit_grad,
    chunk_loss_and_logit_grad_fusable,
    fused_linear_cross_entropy,
    global_normalizer,
)

REPO_ROOT = PACKAGE_DIR.parent
QWEN = load_model_config("qwen2.5-1.5b")


def step_metrics(**overrides):
    metrics = {
        "step": 3,
        "steps": 10,
        "loss": 2.5,
        "lr": 3e-3,
        "grad_norm": 0.75,
        "eval_loss": None,
        "eval_perplexity": None,
        "step_time_s": 0.5,
        "tokens_per_s": 4096.0,
        "tokens_per_s_per_gpu": 2048.0,
        "mfu": 0.42,
        "peak_mem_gib": 3.25,
    }
    metrics.update(overrides)
    return metrics


def summary(**overrides):
    values = dict.fromkeys(report.SUMMARY_KEYS, 1)
    values.update(world_size=2, mfu=None, gpu_name=None, run_dir="runs/x", summary_path="runs/x/summary.json")
    values.update(overrides)
    return values


# --- FLOPs and MFU (PaLM / torchtitan: 6·N + 12·L·H·S) -----------------------------------


def test_qwen_parameter_count_matches_the_published_count():
    assert flops.num_params(QWEN) == 1_543_714_304


def test_qwen_flops_per_token():
    assert round(flops.flops_per_token(QWEN, 2048) / 1e9, 2) == 10.32
    assert round(flops.flops_per_token(QWEN, 4096) / 1e9, 2) == 11.38


@pytest.mark.parametrize("name", ["tiny", "qwen2.5-1.5b"])
def test_parameter_count_matches_the_real_model(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    values = load_model_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values))
    assert flops.num_params(values) == sum(p.numel() for p in model.parameters())


def test_untied_embeddings_count_twice():
    untied = {**QWEN, "tie_word_embeddings": False}
    assert flops.num_params(untied) - flops.num_params(QWEN) == QWEN["vocab_size"] * QWEN["hidden_size"]


def test_untied_input_embedding_does_no_matmul():
    """Untying adds a lookup table, not FLOPs: the lm_head is the one vocab matmul either way."""
    untied = {**QWEN, "tie_word_embeddings": False}
    assert flops.flops_per_token(untied, 4096) == flops.flops_per_token(QWEN, 4096)


def test_attention_term_uses_heads_times_head_dim():
    wide_heads = {**QWEN, "head_dim": 256}  # 12 heads x 256 = 3072, twice hidden_size
    growth = flops.flops_per_token(wide_heads, 4096) - flops.flops_per_token(wide_heads, 2048)
    assert growth == 12 * QWEN["num_hidden_layers"] * 12 * 256 * 2048


def test_causal_figure_halves_the_attention_term():
    full, causal = flops.flops_per_token(QWEN, 4096), flops.flops_per_token(QWEN, 4096, causal=True)
    assert full - causal == 6 * QWEN["num_hidden_layers"] * QWEN["hidden_size"] * 4096


def test_isolated_documents_count_the_attention_their_mask_leaves():
    """Eight documents of 512 tokens in a row of 4096 attend 8 x 512·513/2 query-key pairs, 6.26% of
    the 4096² scores; one document of the whole row is the causal figure, plus its diagonal."""
    share = flops.attended_share([[512] * 8], 4096)
    assert share == 8 * 512 * 513 / 2 / 4096**2
    assert flops.attended_share([[4096]], 4096) == 4097 / 2 / 4096
    full = flops.flops_per_token(QWEN, 4096)
    attention = 12 * QWEN["num_hidden_layers"] * QWEN["hidden_size"] * 4096
    assert flops.flops_per_token(QWEN, 4096, attended=share) == pytest.approx(full - attention * (1 - share))
    assert flops.flops_per_token(QWEN, 4096, attended=0.5) == flops.flops_per_token(QWEN, 4096, causal=True)


@pytest.mark.parametrize(
    "device_name, tflops",
    [
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H200", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A10G", 70),
        ("NVIDIA A10", 125),
        ("NVIDIA H800 PCIe", 756),
        ("NVIDIA H800", 989),
        ("NVIDIA A40", 149.7),
        ("NVIDIA RTX 6000 Ada Generation", 364.2),
    ],
)
def test_peak_flops_per_gpu(device_name, tflops):
    assert flops.peak_flops(device_name) == tflops * 1e12


@pytest.mark.parametrize(
    "device_name",
    [
        None,
        "",
        "cpu",
        "Some Unknown Accelerator",
        "NVIDIA RTX A4000",  # not an A40
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a seventh of an A100: its peak is not the GPU's
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    ],
)
def test_peak_flops_unknown_is_none(device_name):
    assert flops.peak_flops(device_name) is None


def test_mfu_is_model_flops_over_peak():
    per_token = flops.flops_per_token(QWEN, 2048)
    assert flops.mfu(10_000, per_token, 989e12) == pytest.approx(10_000 * 10.31925e9 / 989e12, rel=1e-5)
    assert flops.mfu(10_000, per_token, None) is None


# --- log lines ------------------------------------------------------------------------------


def test_step_line_round_trips():
    line = report.format_step_line(step_metrics())
    assert line.startswith(report.STEP_MARKER + " ")
    assert report.parse_step_line(line) == step_metrics()


def test_step_line_parses_behind_a_ray_worker_prefix():
    line = "\x1b[36m(RayTrainWorker pid=4242, ip=10.0.3.7)\x1b[0m " + report.format_step_line(
        step_metrics(step=7)
    )
    assert report.parse_step_line(line)["step"] == 7


def test_step_line_with_diverged_loss_stays_parseable():
    parsed = report.parse_step_line(report.format_step_line(step_metrics(loss=math.nan, mfu=None)))
    assert parsed["loss"] is None and parsed["mfu"] is None


@pytest.mark.parametrize(
    "line",
    [
        "step 3/10 | loss 2.5000 | 0.500 s/step",
        "TRAIN_STEP {not json",
        'TRAIN_STEP {"step": 3}',
        "",
    ],
)
def test_non_step_lines_parse_to_none(line):
    assert report.parse_step_line(line) is None


def test_step_line_needs_every_key():
    metrics = step_metrics()
    del metrics["mfu"]
    with pytest.raises(KeyError):
        report.format_step_line(metrics)


def test_progress_line_is_human_readable():
    line = report.format_progress_line(step_metrics())
    assert "step  3/10" in line and "loss 2.5000" in line and "MFU 42.0%" in line
    assert "MFU n/a" in report.format_progress_line(step_metrics(mfu=None))


def test_parse_summary_takes_the_last_summary_in_a_log():
    first, last = summary(steps=5), summary(steps=9)
    log = "\n".join(
        [
            "2026-01-01 INFO worker.py -- Started a local Ray instance.",
            report.format_summary(first),
            "(RayTrainWorker pid=1) " + report.format_step_line(step_metrics()),
            '{"transport": "efa", "ok": true}',
            report.format_summary(last),
            "Job 'raysubmit_x' succeeded",
        ]
    )
    assert report.parse_summary(log) == last


def test_parse_summary_without_one_is_none():
    assert report.parse_summary(report.format_step_line(step_metrics()) + "\n{}\nno json here") is None


def test_summary_needs_every_key():
    incomplete = summary()
    del incomplete["loss_last"]
    with pytest.raises(KeyError):
        report.format_summary(incomplete)


def test_log_parsing_modules_import_neither_torch_nor_ray():
    code = (
        "import sys, training, training.metrics.report, training.metrics.flops, training.config.run_config; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


@pytest.mark.slow
def test_torchrun_path_never_imports_ray():
    code = (
        "import sys, training.cli, training.loop, training.launch.torchrun_launcher, training.metrics.artifacts, "
        "training.fabric_probe; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'ray']"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


# --- fused lm_head + cross-entropy ----------------------------------------------------------


@pytest.mark.parametrize("tokens, chunk", [(37, 8), (64, 64), (50, 1000)])
def test_fused_loss_matches_full_logits(tokens, chunk):
    generator = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 16, generator=generator, requires_grad=True)
    weight = torch.randn(40, 16, generator=generator, requires_grad=True)
    labels = torch.randint(0, 40, (tokens,), generator=generator)
    labels[::5] = IGNORE_INDEX

    expected = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE_INDEX)
    expected_grads = torch.autograd.grad(expected * 3, (hidden, weight))
    for chunk_fn in (chunk_loss_and_logit_grad, chunk_loss_and_logit_grad_fusable):
        fused = fused_linear_cross_entropy(hidden, weight, labels, global_normalizer(labels), chunk, chunk_fn)
        fused_grads = torch.autograd.grad(fused * 3, (hidden, weight))

        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6)
        for got, want in zip(fused_grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bf16_gradients_carry_an_unrounded_scale():
    """1/3 is 0.3340 in bf16 (+0.2%): applied to the bf16 hidden-state gradient it would bias
    every element by that much. Scaled in fp32 before the cast, only unbiased rounding is left."""
    assert abs(torch.tensor(1 / 3).to(torch.bfloat16).item() * 3 - 1) > 1e-3
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(48, 256, generator=generator).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(64, 256, generator=generator) * 0.1).to(torch.bfloat16).requires_grad_()
    labels = torch.full((48,), IGNORE_INDEX)
    labels[:3] = torch.tensor([5, 17, 40])  # three valid labels: the loss divides by 3

    fused = fused_linear_cross_entropy(hidden, weight, labels, global_normalizer(labels), 16)
    hidden64, weight64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    expected = F.cross_entropy(hidden64 @ weight64.t(), labels, ignore_index=IGNORE_INDEX)
    for got, want in zip(
        torch.autograd.grad(fused, (hidden, weight)),
        torch.autograd.grad(expected, (hidden64, weight64)),
        strict=True,
    ):
        got = got.double()
        # The least-squares ratio of got to want: 1 up to rounding noise, not 1.002.
        ratio = (got * want).sum() / (want * want).sum()
        assert abs(ratio.item() - 1) < 5e-4


# --- data ------------------------------------------------------------------------------------


def test_packing_joins_documents_with_eos_and_drops_the_tail():
    rows = pack_documents([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 10, 0]], seq_len=3)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 10]])


def test_synthetic_batches_depend_only_on_seed_rank_and_step():
    def batches(rank, start_step):
        return synthetic_batches(
            seed=7, rank=rank, start_step=start_step, batch_size=2, seq_len=5, vocab_size=11
        )

    from_start = batches(0, 0)
    first_three = [next(from_start) for _ in range(3)]
    np.testing.assert_array_equal(next(batches(0, 2)), first_three[2])
    assert not np.array_equal(next(batches(1, 0)), first_three[0])
    assert first_three[0].shape == (2, 6) and first_three[0].max() < 11


def test_synthetic_rows_without_accumulation_are_those_of_earlier_runs():
    """Step k of rank r is still keyed (seed, rank, k), so resuming a run that started before
    accumulation existed replays the rows it trained on."""
    batches = synthetic_batches(
        seed=7, rank=1, start_step=4, batch_size=2, seq_len=5, vocab_size=11, grad_accum_steps=1
    )
    for step in (5, 6, 7):
        earlier = np.random.default_rng([7, 1, step]).integers(0, 11, size=(2, 6), dtype=np.int64)
        np.testing.assert_array_equal(next(batches), earlier)


def test_synthetic_micro_batches_are_distinct_and_keyed_by_step_and_micro_batch():
    def batches(start_step, grad_accum_steps):
        return synthetic_batches(
            seed=7,
            rank=0,
            start_step=start_step,
            batch_size=2,
            seq_len=5,
            vocab_size=11,
            grad_accum_steps=grad_accum_steps,
        )

    from_start = batches(0, 3)
    steps = [[next(from_start) for _ in range(3)] for _ in range(3)]
    rows = [batch.tobytes() for step in steps for batch in step]
    assert len(set(rows)) == len(rows), "a micro-batch repeats another"
    # A resume from step 2 draws step 3's micro-batches, in order.
    resumed = batches(2, 3)
    for micro, expected in enumerate(steps[2]):
        np.testing.assert_array_equal(next(resumed), expected, err_msg=str(micro))
    # Micro-batch 0 of a step is that step's rows without accumulation.
    without = batches(0, 1)
    for step in steps:
        np.testing.assert_array_equal(next(without), step[0])


class _CorpusSession:
    """The part of a launcher's session `_batches` reads: rank and world size."""

    rank = 0
    world_size = 1


@pytest.mark.parametrize("data", ["corpus", SYNTHETIC])
def test_a_resume_with_accumulation_replays_the_rows_of_an_uninterrupted_run(data):
    """A run resumed after step 3 of 2 micro-batches each continues with batch 7 of the stream,
    the first batch the uninterrupted run would have trained on after step 3."""
    from training.data.packing import position_after
    from training.loop import _batches

    argv = ["--seq-len", "32", "--batch-size", "3", "--grad-accum-steps", "2"]
    config = parse_args(argv + (["--data", SYNTHETIC] if data == SYNTHETIC else []))
    files = [str(path) for path in sorted(SHIPPED_CORPUS.iterdir())]
    rows = None if data == SYNTHETIC else corpus_rows(files, tokenizer="bytes", seq_len=32)
    uninterrupted = _batches(config, _CorpusSession(), 257, 0, rows, (0, 0))
    per_step = [[next(uninterrupted) for _ in range(2)] for _ in range(6)]
    position = (
        (0, 0) if rows is None else position_after((0, 0), 6, rows=len(rows), world_size=1, batch_size=3)
    )
    resumed = _batches(config, _CorpusSession(), 257, 3, rows, position)
    for step in per_step[3:]:
        for expected in step:
            np.testing.assert_array_equal(next(resumed), expected)
    assert not np.array_equal(per_step[0][0], per_step[0][1])


def test_tokens_per_step_count_every_micro_batch():
    from training.metrics.run_metrics import RunMetrics
    from training.model.causal_lm import load_architecture

    config = parse_args(["--grad-accum-steps", "4"])
    metrics = RunMetrics(config, load_architecture(config), torch.device("cpu"), 2, 0)
    assert metrics.tokens_per_step == 8 * 128 * 2 * 4
    record = metrics.step(1, 2.0, 0.5, 100, lr=1e-3, grad_norm=1.0, eval_loss=None)
    assert record.tokens_per_s == 8 * 128 * 2 * 4 / 0.5 and record.tokens_per_s_per_gpu == 8 * 128 * 4 / 0.5


def test_local_corpus_splits_rows_between_ranks():
    files = [str(path) for path in sorted(SHIPPED_CORPUS.iterdir())]
    per_rank = [
        local_corpus_batches(
            files,
            tokenizer="bytes",
            seq_len=64,
            batch_size=4,
            seed=0,
            rank=rank,
            world_size=2,
            text_column="text",
            attention="auto",
        )
        for rank in (0, 1)
    ]
    first = [next(batches) for batches in per_rank]
    assert first[0].shape == (4, 65)
    assert not np.array_equal(first[0], first[1])


def test_local_corpus_too_small_for_the_batch_is_an_error(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")
    with pytest.raises(ValueError, match="too few"):
        next(
            local_corpus_batches(
                [str(tmp_path / "tiny.txt")],
                tokenizer="bytes",
                seq_len=64,
                batch_size=1,
                seed=0,
                rank=0,
                world_size=1,
                text_column="text",
                attention="auto",
            )
        )


def test_jsonl_documents_are_rows(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert list(read_documents(str(path))) == ["one", "two"]


def test_byte_tokenizer_round_trips_utf8():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("naïve café")
    assert max(ids) < 256 and tokenizer.decode(ids) == "naïve café"
    assert tokenizer.vocab_size == load_model_config("tiny")["vocab_size"]


# --- configuration ---------------------------------------------------------------------------


def test_shipped_configs_load_into_qwen2config():
    from transformers import Qwen2Config

    for path in CONFIG_DIR.glob("*.json"):
        config = Qwen2Config(**json.loads(path.read_text()))
        assert config.tie_word_embeddings


def test_smoke_preset_is_the_reference_job():
    smoke = PRESETS["smoke"]
    assert (smoke["seq_len"], smoke["batch_size"], smoke["steps"], smoke["data"], smoke["lr"]) == (
        128,
        1,
        5,
        SYNTHETIC,
        2e-5,
    )
    assert smoke["model_id"] == "Qwen/Qwen2.5-1.5B" and smoke["init"] == "pretrained"


def test_default_is_the_tiny_cpu_job_on_the_shipped_corpus():
    config = parse_args([])
    assert (config.preset, config.workers, config.use_gpu, config.launcher) == ("tiny", 2, False, "ray")
    assert Path(config.data) == SHIPPED_CORPUS and Path(config.storage_path).is_absolute()


def test_flags_override_the_preset():
    config = parse_args(
        ["--preset", "throughput", "--steps", "12", "--no-compile", "--hsdp-replicas", "2", "--workers", "8"]
    )
    assert (config.steps, config.compile, config.hsdp_replicas, config.seq_len) == (12, False, 2, 4096)
    assert parse_args(["--preset", "throughput", "--hsdp-replicas", "auto"]).hsdp_replicas == 0


def test_grad_accum_steps_is_one_in_every_preset_and_a_flag():
    assert {name: preset["grad_accum_steps"] for name, preset in PRESETS.items()} == dict.fromkeys(PRESETS, 1)
    assert parse_args(["--preset", "throughput", "--grad-accum-steps", "4"]).grad_accum_steps == 4


def test_gpu_flags_take_both_spellings():
    assert not parse_args(["--preset", "smoke", "--no-gpu"]).use_gpu
    assert not parse_args(["--preset", "smoke", "--no-use-gpu"]).use_gpu
    assert parse_args(["--use-gpu"]).use_gpu and parse_args(["--preset", "smoke"]).use_gpu


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--preset", "huge"],
        ["--data", "/no/such/corpus"],
        ["--launcher", "torchrun", "--local"],
        ["--workers", "6", "--hsdp-replicas", "4"],
        ["--hsdp-replicas", "two"],
        ["--seq-len", "100000"],
        ["--model-config", "no-such-model"],
        ["--max-failures", "-2"],
        ["--grad-accum-steps", "0"],
        ["--unknown-flag"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_reports_bad_arguments_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "training", "--steps", "-1"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "usage:" in result.stderr and "Traceback" not in result.stderr


def test_warmup_is_linear_then_constant():
    config = parse_args(["--lr", "0.01", "--warmup-steps", "4"])
    assert [learning_rate(config, step) for step in (1, 2, 4, 5, 100)] == pytest.approx(
        [0.0025, 0.005, 0.01, 0.01, 0.01]
    )


def test_hsdp_replica_groups():
    assert replica_groups(8, 4, 0) == 2  # auto: one replica group per node
    assert replica_groups(8, 8, 0) == 1
    assert replica_groups(8, 4, 1) == 1
    with pytest.raises(ValueError):
        replica_groups(6, 6, 4)


def test_package_fits_a_configmap():
    """Everything under training/ ships in a ConfigMap (1 MiB); only small text files."""
    files = [path for path in PACKAGE_DIR.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert {path.suffix for path in files} <= {".py", ".json", ".jsonl", ".txt", ".md"}
    assert sum(path.stat().st_size for path in files) < 512 * 1024
    assert sum(path.stat().st_size for path in SHIPPED_CORPUS.iterdir()) < 200 * 1024


def _tiny_lm():
    from training.config.run_config import TrainConfig
    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture

    config = TrainConfig(
        **{**PRESETS["tiny"], "preset": "tiny", "storage_path": "unused", "run_name": "t", "local": False}
    )
    return CausalLMWithFusedLoss(build_causal_lm(config, load_architecture(config), torch.device("cpu")), 64)


def test_float8_swaps_the_decoders_linears_and_keeps_the_lm_head(monkeypatch):
    """torchao converts modules wherever they live; the capability check is what needs the GPU,
    so it is answered here as an L4 (compute capability 8.9) would answer it."""
    from torchao.float8.float8_linear import Float8Linear

    from training.distributed.parallelize import convert_to_float8

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    model = _tiny_lm()
    convert_to_float8(model, torch.device("cuda", 0))
    decoder_linears = [m for m in model.causal_lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert decoder_linears and all(isinstance(m, Float8Linear) for m in decoder_linears)
    assert type(model.causal_lm.lm_head) is torch.nn.Linear


@pytest.mark.parametrize(
    ("device", "capability", "name", "shown"),
    [("cpu", None, None, "a CPU"), ("cuda", (8, 6), "NVIDIA A10G", "NVIDIA A10G")],
)
def test_float8_on_hardware_without_fp8_tensor_cores_is_one_line(
    monkeypatch, device, capability, name, shown
):
    from training.distributed.parallelize import convert_to_float8
    from training.errors import UsageError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    with pytest.raises(
        UsageError, match=f"--float8 needs FP8 tensor cores .*this is {shown}: pass --no-float8"
    ):
        convert_to_float8(_tiny_lm(), torch.device(device, 0) if device == "cuda" else torch.device("cpu"))


def test_a_resume_with_another_accumulation_or_batch_size_is_refused():
    from training.errors import UsageError
    from training.loop import check_resume, replay_facts

    config = parse_args(["--batch-size", "3", "--grad-accum-steps", "2"])
    facts = replay_facts(config, 2, "abc")
    check_resume({"step": 4, "batch_size": 3, "grad_accum_steps": 2}, facts, 30, "ckpt")
    with pytest.raises(
        UsageError, match=r"^ckpt was written with --grad-accum-steps 4: resume with the same"
    ):
        check_resume({"step": 4, "batch_size": 3, "grad_accum_steps": 4}, facts, 30, "ckpt")
    with pytest.raises(UsageError, match=r"^ckpt was written with --batch-size 8:"):
        check_resume({"step": 4, "batch_size": 8, "grad_accum_steps": 1}, facts, 30, "ckpt")
    # A checkpoint from before accumulation existed: one micro-batch, batch size not recorded.
    with pytest.raises(UsageError, match=r"--grad-accum-steps 1:"):
        check_resume({"step": 4}, facts, 30, "ckpt")
    check_resume({"step": 4}, replay_facts(parse_args(["--batch-size", "3"]), 2, "abc"), 30, "ckpt")


@pytest.mark.parametrize(
    ("loss", "grad_norm", "quantity", "value"),
    [
        (math.nan, 1.0, "loss", "nan"),
        (math.inf, math.nan, "loss", "inf"),
        (2.5, -math.inf, "gradient norm", "-inf"),
    ],
)
def test_divergence_names_the_step_the_quantity_its_value_and_the_fix(loss, grad_norm, quantity, value):
    from training.loop import divergence

    message = divergence(7, loss=loss, grad_norm=grad_norm, lr=3e-3)
    assert message is not None and "\n" not in message
    assert message.startswith(f"step 7: the {quantity} is {value};")
    assert "--lr (this step's: 0.003)" in message and "data" in message and "bf16" in message
    assert divergence(7, loss=2.5, grad_norm=1e30, lr=3e-3) is None


class _RecordingSession:
    """A one-rank launcher session that records the steps it was asked to checkpoint."""

    rank, world_size, local_world_size, device = 0, 1, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.checkpointed: list[int] = []
        self.finished = False

    @contextlib.contextmanager
    def latest_checkpoint(self):
        yield None

    def corpus(self, config):
        raise AssertionError("the test trains on synthetic data")

    def report(self, metrics, step, save):
        assert math.isfinite(metrics["loss"])
        if save is not None:
            self.checkpointed.append(step)

    def finish(self, summary, history):
        self.finished = True


def _train_until_it_stops(monkeypatch, argv: list[str], hook=None) -> tuple[str, _RecordingSession, dict]:
    """Train the tiny model on synthetic rows, checkpointing every step; the DivergedError's
    message, the session and the weights the loop was left with (as full tensors)."""
    import training.loop
    from training.errors import DivergedError

    built = []

    def build_and_keep(config, session):
        parts = original_build(config, session)
        if hook is not None:
            parts[0].register_forward_hook(hook)
        built.append(parts[0])
        return parts

    original_build = training.loop.build
    monkeypatch.setattr(training.loop, "build", build_and_keep)
    config = parse_args(
        [
            "--data",
            SYNTHETIC,
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--checkpoint-every",
            "1",
            "--no-tensorboard",
            *argv,
        ]
    )
    session = _RecordingSession()
    with pytest.raises(DivergedError) as raised:
        training.loop.train(config, session)
    weights = {name: param.detach().full_tensor() for name, param in built[0].named_parameters()}
    return str(raised.value), session, weights


def test_a_non_finite_gradient_norm_stops_the_run_before_the_optimizer_step(monkeypatch, one_rank_group):
    """At --lr 1e30 the first update blows the weights up; step 2's gradients overflow."""
    message, session, weights = _train_until_it_stops(monkeypatch, ["--lr", "1e30", "--warmup-steps", "0"])
    assert (
        message.startswith("step 2: the gradient norm is nan;")
        and "Lower --lr (this step's: 1e+30)" in message
    )
    assert all(weight.isfinite().all() for weight in weights.values()), (
        "a non-finite update reached the weights"
    )
    assert session.checkpointed == [1] and not session.finished


def test_a_non_finite_loss_stops_the_run_before_the_optimizer_step(monkeypatch, one_rank_group):
    """From the third forward on, the loss is NaN (and so are its gradients)."""
    forwards = itertools.count(1)

    def poison(module, args, loss):
        return loss * math.nan if next(forwards) >= 3 else loss

    message, session, weights = _train_until_it_stops(monkeypatch, ["--steps", "5"], poison)
    assert message.startswith("step 3: the loss is nan;")
    assert all(weight.isfinite().all() for weight in weights.values()), (
        "a non-finite update reached the weights"
    )
    assert session.checkpointed == [1, 2] and not session.finished


def test_a_step_line_of_an_older_version_parses_with_its_later_keys_none():
    """A job started by an earlier version (no lr, grad_norm or eval keys) is still followed."""
    from training.metrics.report import format_progress_line, parse_step_line

    line = (
        'TRAIN_STEP {"step":1,"steps":5,"loss":11.93,"step_time_s":4.12,"tokens_per_s":248.5,'
        '"tokens_per_s_per_gpu":31.1,"mfu":0.0005,"peak_mem_gib":9.81}'
    )
    parsed = parse_step_line(line)
    assert parsed is not None and parsed["loss"] == 11.93
    assert parsed["lr"] is None and parsed["grad_norm"] is None and parsed["eval_loss"] is None
    assert "lr n/a" in format_progress_line(parsed)
    assert parse_step_line(line.replace('"mfu":0.0005,', "")) is None
