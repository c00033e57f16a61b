"""Resuming, fine-tuning from a checkpoint's weights, and exporting one, in one process.

One rank on gloo (world size 1) trains the tiny model and writes real DCP checkpoints through
the same `save_checkpoint` as the launchers; the data replay is checked on the packing and
dealing functions both launchers use.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.harness.packing_reference import corpus_rows
from tests.harness.session_parts import Uninterrupted
from training.config.run_config import SHIPPED_CORPUS, parse_args, parse_flags
from training.data.batches import epoch_batches, epoch_order, position_after
from training.data.packing import PackedCorpus, corpus_fingerprint
from training.errors import UsageError

FILES = [str(path) for path in sorted(SHIPPED_CORPUS.iterdir())]


def test_relative_paths_are_made_absolute_where_the_flags_are_parsed(tmp_path, monkeypatch):
    """Ray workers run in another working directory: every local path leaves the driver absolute,
    a Hub id or a shipped name as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "tok").mkdir()
    (tmp_path / "arch.json").write_text("{}")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "train_state.json").write_text("{}")
    flags = [
        "--model-id",
        "model",
        "--tokenizer",
        "tok",
        "--model-config",
        "arch.json",
        "--init-from",
        "ckpt",
    ]
    config = parse_flags([*flags, "--init", "pretrained", "--data", "synthetic", "--storage-path", "runs"])
    assert (
        config.model_id,
        config.tokenizer,
        config.model_config,
        config.init_from,
        config.storage_path,
    ) == (
        str(tmp_path / "model"),
        str(tmp_path / "tok"),
        str(tmp_path / "arch.json"),
        str(tmp_path / "ckpt"),
        str(tmp_path / "runs"),
    )
    # A folder named by --model-id is also the default tokenizer of a preset with a Hub tokenizer.
    assert parse_flags(["--preset", "smoke", "--model-id", "model"]).tokenizer == str(tmp_path / "model")
    hub = parse_flags(
        ["--model-id", "Qwen/Qwen2.5-0.5B", "--init", "pretrained", "--tokenizer", "Qwen/Qwen2.5-0.5B"]
    )
    assert (hub.model_id, hub.tokenizer, hub.model_config) == (
        "Qwen/Qwen2.5-0.5B",
        "Qwen/Qwen2.5-0.5B",
        "tiny",
    )


def test_init_from_and_resume_from_do_not_combine(tmp_path):
    (tmp_path / "train_state.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--resume-from continues a run .* give one"):
        parse_flags(["--init-from", str(tmp_path), "--resume-from", str(tmp_path)])
    with pytest.raises(ValueError, match=r"^--init-from '/no/such': not a checkpoint folder"):
        parse_flags(["--init-from", "/no/such"])


def test_a_resume_with_nothing_left_to_train_is_refused_at_parse(tmp_path):
    """Read from the checkpoint's train_state.json on the launching machine, before any worker."""
    (tmp_path / "train_state.json").write_text('{"step": 8}')
    with pytest.raises(ValueError) as refused:
        parse_flags(["--resume-from", str(tmp_path), "--steps", "8"])
    assert str(refused.value) == (
        f"{tmp_path} is at step 8: --steps 8 leaves nothing to train; pass --steps > 8"
    )
    assert parse_flags(["--resume-from", str(tmp_path), "--steps", "9"]).steps == 9


def test_a_resume_on_another_world_size_continues_at_the_next_global_sample():
    """Steps 1-3 at 2 workers x batch 3 took the epoch's samples 0-17; at 1 worker x 2 micro-batches
    (the same 6 sequences a step) the run goes on with samples 18-20 and 21-23, ...; past the
    epoch's end it starts the next epoch's order."""
    rows = corpus_rows(FILES, tokenizer="bytes", seq_len=32)
    order = epoch_order(len(rows), seed=0, epoch=0)
    at_two = [epoch_batches(rows, seed=0, rank=rank, world_size=2, batch_size=3) for rank in (0, 1)]
    seen = [index for _ in range(3) for stream in at_two for index in _indices(rows, next(stream))]
    assert sorted(seen) == sorted(order[:18])
    position = position_after((0, 0), 3, rows=len(rows), global_batch=6)
    assert position == (0, 18)
    at_one = epoch_batches(
        rows, seed=0, rank=0, world_size=1, batch_size=3, grad_accum_steps=2, start=position
    )
    assert _indices(rows, next(at_one)) == list(order[18:21])
    assert _indices(rows, next(at_one)) == list(order[21:24])
    # The epoch holds len(rows) // 6 steps; the one after the last is epoch 1's first.
    per_epoch = len(rows) // 6
    end = position_after(position, per_epoch - 3, rows=len(rows), global_batch=6)
    assert end == (1, 0)
    later = epoch_batches(rows, seed=0, rank=0, world_size=1, batch_size=3, start=end)
    assert _indices(rows, next(later)) == list(epoch_order(len(rows), seed=0, epoch=1)[:3])


def test_a_step_trains_on_the_same_rows_however_workers_and_micro_batches_split_it():
    """2 workers x 1 micro-batch and 1 worker x 2 micro-batches of 3 rows: each step the same 6
    rows, over more than an epoch (whose leftover rows, fewer than a step, are the same too)."""
    rows = corpus_rows(FILES, tokenizer="bytes", seq_len=32)
    steps = len(rows) // 6 + 3
    at_two = [epoch_batches(rows, seed=0, rank=rank, world_size=2, batch_size=3) for rank in (0, 1)]
    at_one = epoch_batches(rows, seed=0, rank=0, world_size=1, batch_size=3, grad_accum_steps=2)
    for step in range(steps):
        two = sorted(index for stream in at_two for index in _indices(rows, next(stream)))
        one = sorted(index for _ in range(2) for index in _indices(rows, next(at_one)))
        assert two == one, step


def _indices(rows: np.ndarray, batch: np.ndarray) -> list[int]:
    """Which rows a batch holds (the shipped corpus packs into distinct rows)."""
    return [int(np.flatnonzero((rows == row).all(axis=1))[0]) for row in batch]


def test_the_fingerprint_follows_the_packed_rows():
    rows = corpus_rows(FILES, tokenizer="bytes", seq_len=32)
    assert corpus_fingerprint(rows) == corpus_fingerprint(rows.copy())
    assert corpus_fingerprint(rows) != corpus_fingerprint(corpus_rows(FILES, tokenizer="bytes", seq_len=64))
    assert corpus_fingerprint(rows) != corpus_fingerprint(
        corpus_rows(FILES[1:], tokenizer="bytes", seq_len=32)
    )


class _FolderSession(Uninterrupted):
    """One rank on CPU whose checkpoints are folders `<root>/<step>`, as the torchrun launcher's."""

    rank, world_size, local_world_size, device = 0, 1, 1, torch.device("cpu")

    def __init__(self, root: Path, resume: str | None = None) -> None:
        self.root, self.resume = root, resume
        self.summary: dict | None = None
        self.history: list[dict] = []

    @contextlib.contextmanager
    def latest_checkpoint(self):
        yield self.resume

    @contextlib.contextmanager
    def open_checkpoint(self, location):
        yield location

    def corpus(self, config):
        rows = corpus_rows(FILES, tokenizer=config.tokenizer, seq_len=config.seq_len)
        return PackedCorpus(rows, corpus_fingerprint(rows))

    def report(self, metrics, step, save):
        if save is not None:
            save(self.checkpoint_folder(step))

    def checkpoint_folder(self, step):
        path = self.root / str(step)
        path.mkdir(parents=True)
        return str(path)

    def publish(self, metrics, step, folder):
        pass

    def finish(self, summary, history):
        self.summary, self.history = summary, history


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


ARGS = ["--seq-len", "32", "--batch-size", "2", "--no-tensorboard", "--warmup-steps", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_rank_group) -> Path:
    """Checkpoints after steps 2 and 3 of the tiny model on the shipped corpus, step 3's with the
    Hugging Face export of the run's end."""
    from training.loop import train

    root = tmp_path_factory.mktemp("ckpts")
    train(parse_args([*ARGS, "--steps", "3", "--checkpoint-every", "2", "--export-hf"]), _FolderSession(root))
    return root


def _checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, read with DCP into a plain model on the CPU."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    state = json.loads((path / "train_state.json").read_text())
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**state["architecture"]))
    weights = {f"causal_lm.{key}": value for key, value in model.state_dict().items()}
    dcp.load({"model": weights}, checkpoint_id=str(path))
    return {key.removeprefix("causal_lm."): value for key, value in weights.items()}


def test_the_train_state_holds_what_the_replay_depends_on(trained):
    state = json.loads((trained / "2" / "train_state.json").read_text())
    rows = corpus_rows(FILES, tokenizer="bytes", seq_len=32)
    assert {key: state[key] for key in ("step", "world_size", "seq_len", "seed", "batch_size", "grad_accum_steps")} == {
        "step": 2, "world_size": 1, "seq_len": 32, "seed": 0, "batch_size": 2, "grad_accum_steps": 1,
    }  # fmt: skip
    assert state["corpus"] == corpus_fingerprint(rows) and state["data_position"] == [0, 4]
    assert state["architecture"]["hidden_size"] == 128 and state["tokenizer"] == "bytes"


def test_a_resume_past_the_last_step_is_refused_before_loading(trained, one_rank_group):
    from training.loop import train

    session = _FolderSession(trained / "again", resume=str(trained / "3"))
    with pytest.raises(
        UsageError, match=r"3 is at step 3: --steps 3 leaves nothing to train; pass --steps > 3$"
    ):
        train(parse_args([*ARGS, "--steps", "3"]), session)
    with pytest.raises(UsageError, match=r"2 was written with --seed 0:"):
        train(parse_args([*ARGS, "--steps", "4", "--seed", "1"]), _FolderSession(trained, str(trained / "2")))


def test_init_from_starts_at_step_one_with_the_checkpoint_weights_and_a_fresh_optimizer(
    trained, tmp_path, monkeypatch, one_rank_group
):
    import training.loop

    seen = []
    original = training.loop.train_step

    def first_step(
        model, optimizer, micro_batches, lr, max_grad_norm, defer_grad_sync=False, *, step, **options
    ):
        if not seen:
            weights = {
                name.removeprefix("causal_lm."): p.detach().full_tensor().clone()
                for name, p in model.named_parameters()
            }
            seen.append((step, len(optimizer.state), weights))
        return original(
            model, optimizer, micro_batches, lr, max_grad_norm, defer_grad_sync, step=step, **options
        )

    monkeypatch.setattr(training.loop, "train_step", first_step)
    session = _FolderSession(tmp_path)
    config = parse_args([*ARGS, "--steps", "2", "--init-from", str(trained / "3")])
    summary = training.loop.train(config, session)
    step, optimizer_entries, weights = seen[0]
    assert (step, optimizer_entries, summary.start_step, summary.resharded) == (1, 0, 0, False)
    assert [entry["step"] for entry in session.history] == [1, 2]
    saved = _checkpoint_weights(trained / "3")
    assert weights.keys() <= saved.keys()
    for name, value in weights.items():
        torch.testing.assert_close(value, saved[name], rtol=0, atol=0, msg=name)
    # Not the random init: the checkpoint's weights differ from a fresh model's.
    fresh = _FolderSession(tmp_path / "fresh")
    seen.clear()
    training.loop.train(parse_args([*ARGS, "--steps", "1"]), fresh)
    assert not torch.equal(seen[0][2]["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])


def test_init_from_a_checkpoint_of_another_architecture_is_refused(trained, tmp_path, one_rank_group):
    from training.loop import train

    arch = tmp_path / "wide.json"
    values = json.loads((SHIPPED_CORPUS.parent / "architectures" / "tiny.json").read_text())
    arch.write_text(json.dumps({**values, "hidden_size": 64}))
    config = parse_args(
        [*ARGS, "--steps", "1", "--init-from", str(trained / "3"), "--model-config", str(arch)]
    )
    with pytest.raises(
        UsageError, match=r"holds a model of hidden_size 128 \(the flags build 64\): pass the --model-config"
    ):
        train(config, _FolderSession(tmp_path))


# Largest difference of the exported model's logits from the checkpoint's, relative to the largest
# logit: fp32 keeps the weights bit for bit; bf16 rounds each to 8 significant bits (2^-9 relative),
# which moved the tiny model's logits by 8.8e-4 of the largest.
LOGIT_TOLERANCE = {"fp32": 0.0, "bf16": 1e-2}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_an_exported_checkpoint_holds_the_tied_embedding_once_in_the_chosen_dtype(trained, tmp_path, dtype):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from training.export import main

    out = tmp_path / "hf"
    assert main([str(trained / "3"), str(out), "--export-dtype", dtype]) == 0
    with safe_open(str(out / "model.safetensors"), "pt") as exported:
        keys = set(exported.keys())
        dtypes = {exported.get_tensor(key).dtype for key in keys}
    saved = _checkpoint_weights(trained / "3")
    assert "lm_head.weight" not in keys and keys == set(saved) - {"lm_head.weight"}
    assert dtypes == {torch.bfloat16 if dtype == "bf16" else torch.float32}
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    reference.load_state_dict(saved)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    tokens = torch.tensor([list(b"the quick brown fox jumps over the lazy dog")])
    with torch.no_grad():
        expected, got = reference(tokens).logits, loaded(tokens).logits
    relative = ((got - expected).abs().max() / expected.abs().max()).item()
    assert relative <= LOGIT_TOLERANCE[dtype], relative
    assert (
        json.loads((out / "config.json").read_text())["dtype"]
        == {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    )


def test_the_export_at_the_end_of_a_run_equals_the_export_of_its_checkpoint(trained, tmp_path):
    from safetensors.torch import load_file

    from training.export import main

    assert main([str(trained / "3"), str(tmp_path / "hf")]) == 0
    at_the_end = load_file(str(trained / "3" / "hf" / "model.safetensors"))
    afterwards = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert at_the_end.keys() == afterwards.keys() and "lm_head.weight" not in at_the_end
    for key, value in at_the_end.items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, afterwards[key]), key


# --- exports that serve: the generation config and the keys transformers 4 reads ----------------

# transformers 4's Qwen2Config (4.57.1, models/qwen2/configuration_qwen2.py) reads the top-level
# `rope_theta` of config.json, and takes this when it is absent.
TRANSFORMERS_4_ROPE_THETA_DEFAULT = 10000.0


def test_a_chat_export_stops_at_the_end_of_turn_and_keeps_its_rope_base_for_transformers_4(tmp_path):
    """Qwen2.5-1.5B's architecture exported with a ChatML tokenizer: generation_config.json stops
    at `<|im_end|>` and at the EOS tokens; config.json carries transformers 5's `rope_parameters` and
    `dtype` and, beside them, the `rope_theta` and `torch_dtype` transformers 4 reads (without
    them it reads RoPE base 10000 for Qwen2.5's 1,000,000)."""
    from transformers import AutoConfig, GenerationConfig

    from tests.harness.chat_tokenizer import IM_END, chatml_tokenizer
    from training.components.checkpoint import write_hugging_face
    from training.config.model_configs import load_model_config
    from training.data.tokenizer import load_tokenizer

    tokenizer_path, ids = chatml_tokenizer(tmp_path / "tokenizer")
    architecture = AutoConfig.for_model(**load_model_config("qwen2.5-1.5b"))
    write_hugging_face(str(tmp_path / "hf"), {}, architecture, "bf16", load_tokenizer(tokenizer_path))

    generation = GenerationConfig.from_pretrained(tmp_path / "hf")
    # The end of turn, the tokenizer's EOS and the model's (Qwen2.5's `<|endoftext|>`, 151643).
    assert generation.eos_token_id == [ids[IM_END], ids["<|endoftext|>"], 151643]
    assert generation.pad_token_id == ids["<|endoftext|>"] and generation.bos_token_id == 151643
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["rope_parameters"] == {"rope_theta": 1000000.0, "rope_type": "default"}
    assert written["dtype"] == "bfloat16"
    # As transformers 4 reads them:
    assert written.get("rope_theta", TRANSFORMERS_4_ROPE_THETA_DEFAULT) == 1000000.0
    assert written["torch_dtype"] == "bfloat16" and "rope_scaling" not in written
    # And transformers as installed loads the same configuration back.
    loaded = AutoConfig.from_pretrained(tmp_path / "hf")
    assert loaded.rope_parameters == {"rope_theta": 1000000.0, "rope_type": "default"}
    differ = {
        key
        for key, value in architecture.to_dict().items()
        if loaded.to_dict().get(key) != value
        and key not in ("_name_or_path", "dtype", "transformers_version")
    }
    assert not differ and loaded.dtype == torch.bfloat16


def test_the_legacy_keys_carry_a_scaled_rope_and_leave_keys_already_there():
    from training.components.checkpoint import legacy_config_keys

    yarn = {"rope_theta": 5e5, "rope_type": "yarn", "factor": 4.0}
    assert legacy_config_keys({"rope_parameters": yarn, "dtype": "float32"}) == {
        "rope_parameters": yarn,
        "dtype": "float32",
        "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
        "torch_dtype": "float32",
    }
    assert (
        legacy_config_keys({"rope_theta": 7.0, "rope_parameters": {"rope_theta": 1e6}})["rope_theta"] == 7.0
    )


def test_the_byte_tokenizers_export_stops_at_its_eos(trained):
    """Its template ends a turn in seven byte tokens (`<|end|>`), which an `eos_token_id` list cannot
    name (any one of them would stop): the EOS alone, and examples/generate.py stops at the bytes."""
    from transformers import GenerationConfig

    from training.data.documents import end_of_turn
    from training.data.tokenizer import ByteTokenizer

    assert end_of_turn(ByteTokenizer()) == list(b"<|end|>")
    generation = GenerationConfig.from_pretrained(trained / "3" / "hf")
    assert generation.eos_token_id == [256] and generation.pad_token_id == 256
    written = json.loads((trained / "3" / "hf" / "config.json").read_text())
    assert written["rope_theta"] == written["rope_parameters"]["rope_theta"] == 10000.0


@pytest.mark.parametrize(
    ("scores", "keep", "kept"),
    [
        ([None, None, None, None], 2, {2, 3}),  # no evaluation: the latest
        ([3.0, 2.0, 2.5, 2.7], 1, {1, 3}),  # the best, and the latest to resume from
        ([3.0, 2.0, 2.5, 2.7], 2, {1, 2, 3}),
        ([3.0, 2.0, 2.5, 1.5], 2, {1, 3}),  # the latest is among the best
        ([2.0, float("nan"), 2.0, 4.0], 1, {2, 3}),  # NaN last; of equal scores the later
        ([], 2, set()),
    ],
)
def test_checkpoints_kept_are_the_best_scored_and_the_latest(scores, keep, kept):
    from training.components.checkpoint import checkpoints_kept

    assert checkpoints_kept(scores, keep) == kept
