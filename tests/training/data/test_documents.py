"""A corpus's documents (training/data/documents.py): the text column, chat rows and per-document
attention: which tokens are trained on, and what each token sees. The byte tokenizer's template
renders a turn as `<|role|>\\n{content}<|end|>\\n`."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.harness.session_parts import NoCheckpoints, Uninterrupted
from training.config.run_config import ArgumentsError, parse_args, parse_flags
from training.data.corpus_cache import in_process_corpus
from training.data.documents import (
    batch_tokens,
    chat_segments,
    document_tokens,
    parse_files_batch,
    read_documents,
    tokenize_batch,
)
from training.data.packing import DOCUMENT_START, NO_LOSS, TOKEN_ID, pack_documents
from training.data.tokenizer import ByteTokenizer
from training.errors import UsageError
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX

CPU = torch.device("cpu")
EOS = ByteTokenizer.eos_id
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
CHAT_RENDERED = "<|user|>\nhi<|end|>\n<|assistant|>\nyo<|end|>\n"
ASSISTANT_TURN = "yo<|end|>\n"  # what the loss covers: the content and the end of its turn


def labelled_bytes(rows: np.ndarray) -> bytes:
    """The label tokens of packed rows that count in the loss, in order."""
    labels = model_batch(rows, CPU).labels.flatten()
    return bytes(labels[labels != IGNORE_INDEX].tolist())


# --- --text-column ------------------------------------------------------------------------------


def test_the_text_column_flag_picks_the_column_of_jsonl_and_parquet(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(
        json.dumps({"body": "one", "text": "not this"}) + "\n" + json.dumps({"body": "two"}) + "\n"
    )
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["no", "nor this"], "body": ["three", "four"]}), table)
    assert read_documents(str(jsonl), "body") == ["one", "two"]
    assert read_documents(str(table), "body") == ["three", "four"]
    assert read_documents(str(table)) == ["no", "nor this"]
    assert parse_args(["--text-column", "body"]).text_column == "body"
    assert parse_args([]).text_column == "text"


def test_a_row_without_the_chosen_column_names_it(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": "x", "id": 1}) + "\n")
    with pytest.raises(UsageError) as raised:
        read_documents(str(path), "body")
    assert (
        str(raised.value) == f"corpus file {path} line 1: no 'body' column; the row's columns: 'text', 'id'"
    )
    with pytest.raises(ArgumentsError, match=r"^argument --text-column: expected a column name, got ' '$"):
        parse_flags(["--text-column", " "])


# --- chat rows ----------------------------------------------------------------------------------


def test_only_the_assistant_turn_of_a_chat_row_carries_labels():
    tokens = document_tokens(CHAT, ByteTokenizer(), "auto")
    np.testing.assert_array_equal(tokens & TOKEN_ID, [*CHAT_RENDERED.encode(), EOS])
    rows = pack_documents([tokens], seq_len=len(tokens) - 1)
    batch = model_batch(rows, CPU)
    assert labelled_bytes(rows) == ASSISTANT_TURN.encode()
    assert batch.loss_tokens == len(ASSISTANT_TURN) == 10
    # Labels are tokens 1.. of the row: the assistant's 10 tokens come last, then the EOS.
    counted = (batch.labels[0] != IGNORE_INDEX).tolist()
    assert counted == [False] * (len(CHAT_RENDERED) - 11) + [True] * 10 + [False]


def test_every_assistant_turn_of_a_conversation_and_nothing_else_carries_labels():
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    tokens = document_tokens(conversation, ByteTokenizer(), "packed")
    rows = pack_documents([tokens], seq_len=len(tokens) - 1)
    assert labelled_bytes(rows) == b"4<|end|>\n6<|end|>\n"
    assert model_batch(rows, CPU).loss_tokens == 18


def test_a_chat_template_that_does_not_extend_its_first_turns_is_refused():
    def reordering(messages, *, generation_prompt):
        return "".join(message["content"] for message in reversed(messages))

    with pytest.raises(
        UsageError, match=r"chat template renders a conversation otherwise than its first turns"
    ):
        chat_segments(
            [*CHAT, {"role": "user", "content": "ok"}, {"role": "assistant", "content": "!"}], reordering
        )


def test_a_tokenizer_without_a_chat_template_refuses_conversations_in_one_line(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from training.data.tokenizer import HuggingFaceTokenizer

    words = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "hi": 2, "yo": 3}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(tmp_path / "plain")
    with pytest.raises(UsageError) as raised:
        document_tokens(CHAT, HuggingFaceTokenizer(str(tmp_path / "plain")), "auto")
    assert str(raised.value) == (
        f"--tokenizer {tmp_path / 'plain'} has no chat template to render the corpus's conversations "
        "('messages' rows) with: use a tokenizer that has one, or text rows"
    )
    # Under Ray it reaches the driver as the same line, through the problem column.
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text(json.dumps({"messages": CHAT}) + "\n")
    files = {
        "path": np.asarray([str(corpus)], dtype=object),
        "bytes": np.asarray([corpus.read_bytes()], dtype=object),
    }
    tokenized = tokenize_batch(
        parse_files_batch(files, text_column="text"), tokenizer=str(tmp_path / "plain"), attention="auto"
    )
    with pytest.raises(UsageError) as through_ray_data:
        batch_tokens(tokenized)
    assert str(through_ray_data.value) == str(raised.value)
    fast.chat_template = (
        "{% for m in messages %}[{{ m.role }}] {{ m.content }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    fast.save_pretrained(tmp_path / "chat")
    templated = HuggingFaceTokenizer(str(tmp_path / "chat"))
    assert chat_segments(CHAT, templated.render_chat) == [
        ("[user] hi <eos> [assistant] ", False),
        ("yo <eos> ", True),
    ]


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([], "'messages' is empty"),
        ("hi", "'messages' is \"hi\", not a list of messages"),
        (
            [{"role": "user"}],
            "'messages' item 0 is {\"role\": \"user\"}, not an object with string 'role' and 'content'",
        ),
        (
            [{"role": "user", "content": "hi"}],
            "'messages' holds no assistant message, so no token to train on",
        ),
    ],
)
def test_a_bad_conversation_is_one_line_naming_file_line_and_column(tmp_path, messages, problem):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": messages}) + "\n")
    with pytest.raises(UsageError) as raised:
        read_documents(str(path))
    assert str(raised.value) == f"corpus file {path} line 2: {problem}"


def test_parquet_conversations_and_a_bad_one(tmp_path):
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.table({"messages": [CHAT, CHAT]}), path)
    assert read_documents(str(path)) == [CHAT, CHAT]
    pq.write_table(pa.table({"messages": [CHAT, CHAT[:1]]}), path)
    with pytest.raises(UsageError, match=r"chat.parquet row index 1: 'messages' holds no assistant message"):
        read_documents(str(path))


def test_ray_datas_functions_tokenize_text_and_chat_rows_like_the_in_process_reader(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"text": "plain"}) + "\n" + json.dumps({"messages": CHAT}) + "\n")
    files = {
        "path": np.asarray([str(path)], dtype=object),
        "bytes": np.asarray([path.read_bytes()], dtype=object),
    }
    parsed = parse_files_batch(files, text_column="text")
    tokenized = tokenize_batch(parsed, tokenizer="bytes", attention="auto")
    expected = [document_tokens(document, ByteTokenizer(), "auto") for document in read_documents(str(path))]
    assert len(tokenized["tokens"]) == 2
    for got, want in zip(tokenized["tokens"], expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert list(tokenized["problem"]) == ["", ""]


class _CorpusSession(NoCheckpoints, Uninterrupted):
    """A one-rank launcher reading the corpus in process, as torchrun's does."""

    rank, world_size, local_world_size, device = 0, 1, 1, CPU

    def __init__(self) -> None:
        self.summary: dict = {}

    @contextlib.contextmanager
    def latest_checkpoint(self):
        yield None

    @contextlib.contextmanager
    def open_checkpoint(self, location):
        yield location

    def corpus(self, config):
        return in_process_corpus(config)

    def finish(self, summary, history):
        self.summary = summary


def test_a_chat_run_reports_the_tokens_it_saw_and_the_assistant_tokens_it_trained_on(
    tmp_path, one_rank_group
):
    """Rows of exactly one conversation each: every row has the 10 assistant tokens as labels."""
    from training.loop import train

    (tmp_path / "chat.jsonl").write_text((json.dumps({"messages": CHAT}) + "\n") * 12)
    seq_len = len(CHAT_RENDERED)  # the conversation and its EOS fill a row of seq_len + 1
    argv = ["--data", str(tmp_path / "chat.jsonl"), "--seq-len", str(seq_len), "--batch-size", "2"]
    config = parse_args([*argv, "--steps", "3", "--checkpoint-every", "0", "--storage-path", str(tmp_path)])
    session = _CorpusSession()
    train(config, session)
    assert session.summary["tokens_seen"] == 3 * 2 * seq_len
    assert session.summary["loss_tokens"] == 3 * 2 * 10


# --- per-document attention ---------------------------------------------------------------------


def test_auto_isolates_conversations_and_the_document_after_one():
    tokenizer = ByteTokenizer()
    documents = ["first text", CHAT, "text after the chat", "text after text"]
    pieces = [document_tokens(document, tokenizer, "auto") for document in documents]
    rows = pack_documents(pieces, seq_len=sum(map(len, pieces)) - 1)
    starts = [int(pieces[0].size), int(pieces[0].size + pieces[1].size), int(sum(p.size for p in pieces[:3]))]
    assert np.flatnonzero(rows[0] & DOCUMENT_START).tolist() == starts[:2]
    assert not rows[0][starts[2]] & DOCUMENT_START
    # Isolated everywhere, or nowhere (chat rows keep their NO_LOSS flags either way).
    isolated = pack_documents(
        [document_tokens(d, tokenizer, "isolated") for d in documents], seq_len=len(rows[0]) - 1
    )
    assert np.flatnonzero(isolated[0] & DOCUMENT_START).tolist() == [0, *starts]
    packed = pack_documents(
        [document_tokens(d, tokenizer, "packed") for d in documents], seq_len=len(rows[0]) - 1
    )
    assert not (packed & DOCUMENT_START).any() and (packed & NO_LOSS).any()
    # Rows without a document start inside them run plain causal attention: no position ids.
    assert model_batch(packed, CPU).position_ids is None
    assert model_batch(rows, CPU).position_ids is not None


def test_a_gpu_run_packs_every_text_document_isolated_by_default(tmp_path):
    """The packer of a run with --gpu flags each text document's start (`auto` on GPUs) and lays
    each whole in a row; the same corpus without --gpu packs the text causally, cut wherever a row
    ends, as before."""
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": f"document {i} " * 5}) + "\n" for i in range(12))
    )
    argv = ["--data", str(tmp_path / "docs.jsonl"), "--seq-len", "64", "--storage-path", str(tmp_path)]
    on_gpus = in_process_corpus(parse_flags([*argv, "--gpu"]))
    on_cpus = in_process_corpus(parse_flags(argv)).rows
    assert (on_gpus.rows & DOCUMENT_START).sum() >= 12 and not (on_cpus & DOCUMENT_START).any()
    assert (on_gpus.rows[:, 0] & DOCUMENT_START).all()  # no document continues from a row before
    documents = on_gpus.rows[(on_gpus.rows & NO_LOSS) == 0] & TOKEN_ID  # filler aside
    stream = np.concatenate(
        [document_tokens(f"document {i} " * 5, ByteTokenizer(), "packed") for i in range(12)]
    )
    np.testing.assert_array_equal(documents, stream)
    np.testing.assert_array_equal(on_cpus.reshape(-1) & TOKEN_ID, stream[: on_cpus.size])
    assert on_gpus.packing.documents == 12 and on_gpus.packing.filler_tokens == on_gpus.rows.size - len(
        stream
    )


# FlexAttention compiles its kernel on first use (about 13 s on the CPU), so it runs with the slow tests.
@pytest.mark.parametrize("attention", ["sdpa", pytest.param("flex", marks=pytest.mark.slow)])
def test_a_packed_document_sees_only_itself_when_isolated(attention):
    """The logits of document 2 in a packed row equal those of document 2 run alone (float32),
    and the loss through the job's model over its labels equals its loss alone, with either
    attention kernel the job builds (flex forward only: FlexAttention has no CPU backward)."""
    from training.config.run_config import parse_args
    from training.config.settings import ATTENTION_KERNELS
    from training.model.attention import document_block_mask
    from training.model.causal_lm import CausalLMWithFusedLoss, build_causal_lm, load_architecture

    config = parse_args(["--preset", "tiny", "--gpu", "--attention", attention])
    causal_lm = build_causal_lm(config, load_architecture(config), CPU)
    assert causal_lm.config._attn_implementation == ATTENTION_KERNELS[attention]
    causal_lm.eval()
    tokenizer = ByteTokenizer()
    texts = ["The first document, a little longer.", "Then the second.", "And a third one."]
    pieces = [document_tokens(text, tokenizer, "isolated") for text in texts]
    rows = pack_documents(pieces, seq_len=sum(map(len, pieces)) - 1)
    batch = model_batch(rows, CPU)
    assert batch.position_ids is not None
    second = slice(len(pieces[0]), len(pieces[0]) + len(pieces[1]))
    assert batch.position_ids[0, second].tolist() == list(range(len(pieces[1])))
    # The label that would predict document 2's first token from document 1 is not trained on.
    assert batch.labels[0, second.start - 1] == IGNORE_INDEX

    alone_ids = torch.tensor(pieces[1] & TOKEN_ID, dtype=torch.int64).unsqueeze(0)
    # With flex, the job's own block mask from the document ids (CausalLMWithFusedLoss's path).
    mask = {"attention_mask": document_block_mask(batch.document_ids)} if attention == "flex" else {}
    with torch.no_grad():
        alone = causal_lm(input_ids=alone_ids, use_cache=False).logits[0]
        isolated = causal_lm(
            input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, **mask
        ).logits
        packed = causal_lm(input_ids=batch.input_ids, use_cache=False).logits
    torch.testing.assert_close(isolated[0, second], alone, rtol=1e-5, atol=1e-5)
    assert (packed[0, second] - alone).abs().max() > 1e-2, "packed attention would have seen document 1"

    model = CausalLMWithFusedLoss(causal_lm, loss_chunk_tokens=16)
    only_second = torch.full_like(batch.labels, IGNORE_INDEX)
    only_second[0, second.start : second.stop - 1] = batch.labels[0, second.start : second.stop - 1]
    with torch.no_grad():
        in_the_row = model(batch.input_ids, only_second, None, batch.position_ids, batch.document_ids)
        by_itself = model(alone_ids[:, :-1], alone_ids[:, 1:])
    torch.testing.assert_close(in_the_row, by_itself, rtol=1e-5, atol=1e-5)
