"""`examples/generate.py` answering with the model of the worked fine-tune of
docs/training/fine-tune.md, end to end on the CPU: generated instruction data in the chat format, a
run with held-out evaluation whose eval loss falls, its TensorBoard events, and the exported model
loaded back with `from_pretrained` answering a question.

It runs the loop through the torchrun launcher's session in this process (one gloo rank), which
reads the corpus as `--launcher torchrun` does; the docs' `--local` command reads the same rows
through Ray Data (`test_ray_data_rows_are_exact_and_equal_the_torchrun_rows`)."""

from __future__ import annotations

import json
import re

import pytest

from examples.generate import answer, run_tokenizer
from examples.instruction_data import write_dataset
from tests.harness.paths import REPO_ROOT
from tests.harness.tensorboard_events import read_scalars
from training.config.presets import BYTE_TOKENIZER
from training.config.run_config import parse_args, parse_flags

DOCS = REPO_ROOT / "docs" / "training" / "fine-tune.md"


def test_the_docs_worked_example_runs_these_flags():
    """The docs' worked example passes the flags the test below trains with (with the values of a
    longer run), and its command parses."""
    command = re.search(r"^python -m training --local (--data .*)$", DOCS.read_text(), re.MULTILINE)
    assert command, "docs/training/fine-tune.md has no worked fine-tune command"
    flags = command.group(1).split()
    for flag in ("--data", "--eval-data", "--eval-every", "--lr-schedule", "--warmup-steps", "--export-hf"):
        assert flag in flags, flag
    parse_flags(flags, paths_here=False)  # the docs' command parses (its data is written first)


@pytest.mark.slow
def test_a_chat_fine_tune_evaluates_falling_logs_to_tensorboard_and_exports_a_model_that_answers(
    tmp_path, monkeypatch, one_rank_group
):
    import torch

    from training.launch.torchrun_launcher import TorchrunSession
    from training.loop import train

    write_dataset(tmp_path / "data", train_rows=600, eval_rows=60, seed=0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = parse_args(
        [
            *("--data", str(tmp_path / "data" / "train.jsonl")),
            *("--eval-data", str(tmp_path / "data" / "eval.jsonl")),
            *("--eval-every", "20", "--checkpoint-every", "20", "--steps", "60"),
            *("--lr-schedule", "cosine", "--warmup-steps", "3"),
            *("--export-hf", "--storage-path", str(tmp_path / "runs"), "--run-name", "chat"),
        ]
    )
    train(config, TorchrunSession(config, torch.device("cpu")))

    run = tmp_path / "runs" / "chat"
    summary = json.loads((run / "summary.json").read_text())
    evals = [(row["step"], row["eval_loss"]) for row in summary["history"] if row["eval_loss"] is not None]
    assert [step for step, _ in evals] == [20, 40, 60]
    losses = [loss for _, loss in evals]
    assert losses[0] > losses[1] > losses[2], evals
    assert losses[-1] < 0.6 * summary["loss_first"]  # from about log(257) = 5.55 at the start
    assert summary["loss_tokens"] < summary["tokens_seen"] / 2  # only the assistant's turns

    logged = read_scalars(run / "tensorboard")["loss/eval"]
    assert logged == {step: pytest.approx(loss, rel=1e-6) for step, loss in evals}

    exported = str(run / "checkpoint_000060" / "hf")
    assert run_tokenizer(exported, None) == BYTE_TOKENIZER
    reply = answer(exported, "Say hello to Vera.", tokenizer=BYTE_TOKENIZER, max_new_tokens=40)
    assert reply and "<|end|>" not in reply
    # Whole conversations, none cut or truncated: at seq 128 a row holds one, the rest filler.
    packing = summary["packing"]["data"]
    assert (packing["documents"], packing["documents_truncated"], packing["tokens_truncated"]) == (600, 0, 0)
    assert packing["filler_tokens"] > 0


@pytest.mark.slow
def test_a_chat_fine_tune_with_a_chatml_tokenizer_exports_a_model_whose_generate_stops_at_its_turns_end(
    tmp_path, monkeypatch, one_rank_group
):
    """With a tokenizer whose template ends a turn in a special token (`<|im_end|>`, as Qwen2.5's),
    the export's generation_config.json stops `generate()` there: each reply ends in it, well before
    max_new_tokens. The base config's `eos_token_id` alone (`<|endoftext|>`, which a chat
    fine-tune never learns to emit after a turn) ran every reply to max_new_tokens.
    examples/generate.py stops at the same token."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.harness.chat_tokenizer import IM_END, chatml_model_config, chatml_tokenizer
    from training.data.tokenizer import load_tokenizer
    from training.launch.torchrun_launcher import TorchrunSession
    from training.loop import train

    write_dataset(tmp_path / "data", train_rows=600, eval_rows=60, seed=0)
    tokenizer, ids = chatml_tokenizer(tmp_path / "tokenizer")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = parse_args(
        [
            *("--data", str(tmp_path / "data" / "train.jsonl"), "--steps", "150", "--warmup-steps", "3"),
            *("--lr-schedule", "cosine", "--tokenizer", tokenizer, "--checkpoint-every", "0"),
            *("--model-config", chatml_model_config(tmp_path / "arch.json", ids), "--export-hf"),
            *("--storage-path", str(tmp_path / "runs"), "--run-name", "chatml", "--no-tensorboard"),
        ]
    )
    train(config, TorchrunSession(config, torch.device("cpu")))

    exported = tmp_path / "runs" / "chatml" / "checkpoint_000150" / "hf"
    assert run_tokenizer(str(exported), None) == str(exported)  # the export's own tokenizer
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    assert model.generation_config.eos_token_id == [ids[IM_END], ids["<|endoftext|>"]]
    encoder = load_tokenizer(str(exported))
    for question in ("Say hello to Vera.", "Repeat stone 3 times.", "What is 12 plus 30?"):
        prompt = encoder.render_chat([{"role": "user", "content": question}], generation_prompt=True)
        prompt_ids = torch.tensor([encoder.encode(prompt)])
        output = model.generate(prompt_ids, max_new_tokens=80, do_sample=False)  # its own config
        reply = output[0, prompt_ids.shape[1] :].tolist()
        assert reply[-1] == ids[IM_END] and len(reply) < 80, (question, encoder.decode(reply))
        assert (
            answer(str(exported), question, tokenizer=str(exported), max_new_tokens=80)
            == encoder.decode(reply[:-1]).strip()
        )
