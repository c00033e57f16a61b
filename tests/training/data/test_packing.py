"""The corpus pipeline: packing, per-epoch order, and the Ray Data path against the in-process one.

The in-process reader is what torchrun ranks use; the Ray Data path tokenizes on
a real local Ray and packs on the driver. Both must give the same rows, whatever
the block layout. Text packed across documents is the document stream cut in order, with an
end-of-document token between every two documents and at most one partial row dropped; an
isolated document (a conversation) lies whole in one row, next-fit.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from examples.instruction_data import write_dataset
from tests.harness.packing_reference import corpus_rows, local_corpus_batches
from training.config.run_config import SHIPPED_CORPUS, corpus_files, parse_args
from training.data.documents import document_tokens, read_documents, tokenize
from training.data.packing import (
    DOCUMENT_START,
    NO_LOSS,
    ROW_DTYPE,
    TOKEN_ID,
    PackingStats,
    RowPacker,
    corpus_fingerprint,
    pack_documents,
)
from training.data.tokenizer import ByteTokenizer
from training.errors import UsageError
from training.model.causal_lm import model_batch
from training.model.loss import IGNORE_INDEX

SEQ_LEN = 32
EOS = ByteTokenizer.eos_id


def documents_stream(files: list[str]) -> np.ndarray:
    """Every document's bytes followed by EOS, in corpus order: what packing must cut into rows."""
    tokens: list[int] = []
    for path in files:
        for document in read_documents(path):
            tokens.extend(document.encode("utf-8"))
            tokens.append(EOS)
    return np.asarray(tokens)


def assert_exact_packing(rows: np.ndarray, files: list[str], seq_len: int) -> None:
    """Rows are the document stream cut in order; only the last partial row is missing."""
    stream = documents_stream(files)
    row_length = seq_len + 1
    assert rows.shape == (len(stream) // row_length, row_length)
    np.testing.assert_array_equal(rows.reshape(-1), stream[: rows.size])
    assert len(stream) - rows.size < row_length


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory) -> Path:
    """Every file type, short and long documents, documents of equal length."""
    root = tmp_path_factory.mktemp("mixed")
    (root / "a_long.txt").write_text("The long one. " * 40)
    (root / "b_notes.jsonl").write_text(
        "".join(json.dumps({"text": f"note {i:02d}"}) + "\n" for i in range(12))
    )
    pq.write_table(pa.table({"text": [f"row {i} of the table" for i in range(5)]}), root / "c_table.parquet")
    (root / "d_empty.md").write_text("")
    (root / "e_tiny.txt").write_text("hi")
    return root


@pytest.fixture(scope="module")
def short_notes(tmp_path_factory) -> Path:
    """Hundreds of documents, each far below seq_len tokens."""
    root = tmp_path_factory.mktemp("notes")
    for index in range(300):
        (root / f"note_{index:03d}.txt").write_text(f"Note {index}: the kettle boiled at {index % 60} past.")
    return root


# --- in process (torchrun) ----------------------------------------------------------------------


def test_packing_keeps_every_document_and_its_eos():
    documents = [[1, 2, 3, 0], [0], [4, 0], [5, 6, 7, 8, 9, 10, 11, 0], [12, 13, 0]]
    rows = pack_documents(documents, seq_len=3)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 0], [0, 4, 0, 5], [6, 7, 8, 9], [10, 11, 0, 12]])


def isolated(*lengths: int, first: int = 1) -> list[np.ndarray]:
    """Documents of these lengths, each attending only to itself: ids from `first` on, the last
    token an end-of-document token (0)."""
    documents, token = [], first
    for length in lengths:
        tokens = np.arange(token, token + length, dtype=ROW_DTYPE)
        tokens[-1], tokens[0] = 0, tokens[0] | DOCUMENT_START
        documents.append(tokens)
        token += length
    return documents


FILL = NO_LOSS | 0  # filler: the end-of-document token before it (0), no loss


def test_isolated_documents_lie_whole_in_a_row_next_fit():
    """A document that does not fit the rest of a row starts the next; filler that carries no loss
    (one document of its own) ends the row; the last row is kept, filled."""
    one, two, three = isolated(3, 3, 2)
    packer_rows = pack_documents([one, two, three], seq_len=4)
    start = DOCUMENT_START
    np.testing.assert_array_equal(
        packer_rows,
        [
            [*one, FILL | start, FILL],  # `two` (3) does not fit the 2 left
            [*two, *three[:1], three[1]],  # `three` (2) fits the 2 left
        ],
    )
    four, five = isolated(2, 2, first=9)
    np.testing.assert_array_equal(
        pack_documents([one, four, five], seq_len=4), [[*one, *four], [*five, FILL | start, FILL, FILL]]
    )


def test_a_conversation_longer_than_a_row_is_truncated_to_one_and_counted():
    """Its turns past the row would train without their prompt (the tokens that carry no loss)."""
    written: list[bytes] = []
    packer = RowPacker(written.append, seq_len=4)
    short, long, last = isolated(2, 8, 3)
    long[1:3] |= NO_LOSS  # a prompt
    for document in (short, long, last):
        packer.add(document)
    packer.finish()
    rows = np.frombuffer(b"".join(written), dtype=ROW_DTYPE).reshape(-1, 5)
    np.testing.assert_array_equal(
        rows,
        [[*short, FILL | DOCUMENT_START, FILL, FILL], long[:5], [*last, FILL | DOCUMENT_START, FILL]],
    )
    assert packer.stats == PackingStats(
        documents=3, documents_truncated=1, tokens_truncated=3, filler_tokens=5
    )


def test_an_isolated_text_longer_than_a_row_starts_a_row_and_runs_on():
    """Every token of a text is a target: it is split, not truncated (a book on GPUs, where text is
    isolated, is trained whole), and the document after it goes on next-fit."""
    short, long, last = isolated(2, 8, 3)
    rows = pack_documents([short, long, last], seq_len=4)
    np.testing.assert_array_equal(
        rows,
        [
            [*short, FILL | DOCUMENT_START, FILL, FILL],
            long[:5],
            [*long[5:], FILL | DOCUMENT_START, FILL],  # `last` (3) does not fit the 2 left
            [*last, FILL | DOCUMENT_START, FILL],
        ],
    )
    written: list[bytes] = []
    packer = RowPacker(written.append, seq_len=4)
    for document in (short, long, last):
        packer.add(document)
    packer.finish()
    assert packer.stats == PackingStats(documents=3, documents_split=1, filler_tokens=7)


def test_text_after_a_conversation_starts_afresh_and_runs_on_across_rows():
    """Packed text is cut wherever a row ends, as before; the document after an isolated one starts
    afresh (nothing sees into the isolated one) but is not moved to a new row."""
    [conversation] = isolated(3)
    text, more = np.arange(20, 25, dtype=ROW_DTYPE), np.arange(30, 33, dtype=ROW_DTYPE)
    rows = pack_documents([conversation, text, more], seq_len=3)
    np.testing.assert_array_equal(
        rows, [[*conversation, 20 | DOCUMENT_START], [21, 22, 23, 24]]
    )  # `more`'s 3 tokens: the last partial row of packed text, dropped


def test_isolated_text_loses_no_token_of_the_shipped_corpus():
    """Its 11 documents isolated (text on GPUs) at seq 128, each longer than a row (181 to 3,227
    tokens): each starts a row and runs on; every token is there once, in order, filler aside.
    Truncated to a row, 92% of the corpus would be lost."""
    files = corpus_files(str(SHIPPED_CORPUS))
    documents = list(tokenize((d for path in files for d in read_documents(path)), "bytes", "isolated"))
    written: list[bytes] = []
    packer = RowPacker(written.append, 128)
    for tokens in documents:
        packer.add(tokens)
    packer.finish()
    rows = np.frombuffer(b"".join(written), dtype=ROW_DTYPE).reshape(-1, 129)
    np.testing.assert_array_equal(
        rows[(rows & NO_LOSS) == 0] & TOKEN_ID, np.concatenate(documents) & TOKEN_ID
    )
    assert packer.stats == PackingStats(
        documents=11, documents_split=11, filler_tokens=rows.size - sum(map(len, documents))
    )


def conversation_labels(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of each row's labels, those that count in the loss, and those of them in a document that
    began in an earlier row (no document start at or before the label's token in its row)."""
    labels = model_batch(rows, torch.device("cpu")).labels.numpy()
    started = np.maximum.accumulate((rows & DOCUMENT_START) != 0, axis=1)[:, 1:]
    counted = labels != IGNORE_INDEX
    return counted, counted & ~started


@pytest.mark.parametrize("seq_len", [128, 512])
def test_the_worked_examples_conversations_train_whole_in_their_rows(tmp_path, seq_len):
    """docs/training/fine-tune.md's data (2,000 conversations): every loss label lies in a
    conversation that begins in its own row, and every assistant token of every conversation is a
    label once. Packed across rows, 50.8% of the labels at seq 128 and 12.8% at 512 lay in a
    conversation begun in the row before."""
    write_dataset(tmp_path, train_rows=2000, eval_rows=1, seed=0)
    conversations = read_documents(str(tmp_path / "train.jsonl"))
    documents = list(tokenize(conversations, "bytes", "auto"))
    written: list[bytes] = []
    packer = RowPacker(written.append, seq_len)
    for tokens in documents:
        packer.add(tokens)
    packer.finish()
    rows = np.frombuffer(b"".join(written), dtype=ROW_DTYPE).reshape(-1, seq_len + 1)
    counted, carried_over = conversation_labels(rows)
    assert counted.sum() > 0 and carried_over.sum() == 0
    assert (rows[:, 0] & DOCUMENT_START).all()
    # Each conversation's loss tokens (its assistant turns), all of them, and nothing else.
    assert counted.sum() == sum(int(((tokens & NO_LOSS) == 0).sum()) for tokens in documents)
    assert packer.stats.documents == 2000 and packer.stats.documents_truncated == 0
    kept = rows[(rows & NO_LOSS) == 0] & TOKEN_ID
    assert len(kept) == counted.sum()  # no filler token is a loss target
    assert packer.stats.filler_tokens == rows.size - sum(len(tokens) for tokens in documents)


def test_a_text_document_and_an_empty_one_end_in_eos():
    tokenizer = ByteTokenizer()
    np.testing.assert_array_equal(document_tokens("hi", tokenizer, "packed"), [104, 105, EOS])
    np.testing.assert_array_equal(document_tokens("", tokenizer, "packed"), [EOS])


@pytest.mark.parametrize("corpus", ["shipped", "mixed"])
def test_in_process_rows_are_the_document_stream_cut_in_order(corpus, mixed_corpus):
    files = corpus_files(str(SHIPPED_CORPUS if corpus == "shipped" else mixed_corpus))
    rows = corpus_rows(files, tokenizer="bytes", seq_len=SEQ_LEN, text_column="text", attention="packed")
    assert_exact_packing(rows, files, SEQ_LEN)


def row_set(batches) -> list[bytes]:
    return [row.tobytes() for batch in batches for row in batch]


def epochs_seen(*, seed: int, world_size: int = 2, batch_size: int = 4, epochs: int = 3) -> list[list[bytes]]:
    """Rows each epoch of the torchrun path trains on (all ranks), epoch by epoch."""
    files = corpus_files(str(SHIPPED_CORPUS))
    streams = [
        local_corpus_batches(
            files,
            tokenizer="bytes",
            seq_len=SEQ_LEN,
            batch_size=batch_size,
            seed=seed,
            rank=rank,
            world_size=world_size,
            text_column="text",
            attention="auto",
        )
        for rank in range(world_size)
    ]
    rows = len(pack_documents(documents_as_bytes(files), SEQ_LEN))
    per_epoch = rows // (world_size * batch_size)
    return [row_set(next(stream) for stream in streams for _ in range(per_epoch)) for _ in range(epochs)]


def documents_as_bytes(files: list[str]) -> list[list[int]]:
    return [[*document.encode("utf-8"), EOS] for path in files for document in read_documents(path)]


def test_each_epoch_trains_every_row_once_and_leaves_over_different_rows():
    files = corpus_files(str(SHIPPED_CORPUS))
    all_rows = set(row_set([pack_documents(documents_as_bytes(files), SEQ_LEN).astype(np.int64)]))
    epochs = epochs_seen(seed=0)
    leftovers = []
    for seen in epochs:
        assert len(seen) == len(set(seen)), "a row twice in one epoch"
        assert set(seen) <= all_rows
        left = all_rows - set(seen)
        assert len(left) < 2 * 4  # less than one global batch
        leftovers.append(frozenset(left))
    assert len(set(leftovers)) == len(leftovers), "the same rows are left over in two epochs"
    assert epochs[0] != epochs[1]  # a fresh order each epoch


def test_epoch_order_is_seeded():
    assert epochs_seen(seed=0, epochs=2) == epochs_seen(seed=0, epochs=2)
    assert epochs_seen(seed=0, epochs=1) != epochs_seen(seed=1, epochs=1)


# --- Ray Data (Ray Train) against the in-process path ------------------------------------------


@pytest.fixture(scope="module")
def joined_ray(ray_head):
    """This process as a driver of the session's Ray head: Ray Data's tasks run on its workers."""
    import ray

    ray.init(address=ray_head.address)
    yield
    ray.shutdown()


def ray_rows(data: Path, *, blocks: int | None = None) -> np.ndarray:
    """The rows the Ray driver streams into the corpus cache, here into memory."""
    from training.launch.ray_corpus import pack_dataset, tokenized_documents

    config = dataclasses.replace(parse_args(["--data", str(data), "--seq-len", str(SEQ_LEN)]), local=True)
    documents = tokenized_documents(corpus_files(config.data), config)
    if blocks is not None:
        documents = documents.repartition(blocks)
    written = io.BytesIO()
    packer = RowPacker(written.write, SEQ_LEN)
    pack_dataset(documents, packer)
    fingerprint = packer.finish()
    rows = np.frombuffer(written.getvalue(), dtype=ROW_DTYPE).reshape(-1, SEQ_LEN + 1)
    assert fingerprint == corpus_fingerprint(rows)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["shipped", "mixed"])
def test_ray_data_rows_are_exact_and_equal_the_torchrun_rows(corpus, mixed_corpus, joined_ray):
    data = SHIPPED_CORPUS if corpus == "shipped" else mixed_corpus
    files = corpus_files(str(data))
    rows = ray_rows(data)
    assert_exact_packing(rows, files, SEQ_LEN)
    assert (rows == EOS).any(axis=1).sum() >= 1
    np.testing.assert_array_equal(
        rows, corpus_rows(files, tokenizer="bytes", seq_len=SEQ_LEN, text_column="text", attention="auto")
    )


@pytest.mark.slow
def test_ray_data_rows_of_conversations_and_text_equal_the_torchrun_rows(tmp_path, joined_ray):
    """Conversations cross Ray Data's tasks as JSON and keep their flags: which tokens are loss
    targets and where documents start, as the in-process reader packs them."""
    from training.data.packing import NO_LOSS

    chat = [{"role": "user", "content": f"question {i}"} for i in range(3)]
    lines = [{"messages": [turn, {"role": "assistant", "content": "an answer"}]} for turn in chat]
    (tmp_path / "a_chat.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines * 8))
    (tmp_path / "b_text.jsonl").write_text(
        "".join(json.dumps({"text": f"plain {i}"}) + "\n" for i in range(9))
    )
    rows = ray_rows(tmp_path)
    files = corpus_files(str(tmp_path))
    in_process = corpus_rows(files, tokenizer="bytes", seq_len=SEQ_LEN, text_column="text", attention="auto")
    np.testing.assert_array_equal(rows, in_process)
    assert (rows & NO_LOSS).any() and not (rows[-1] & NO_LOSS).all()


@pytest.mark.slow
def test_ray_data_rows_do_not_depend_on_the_block_layout(mixed_corpus, joined_ray):
    reference = ray_rows(mixed_corpus)
    for blocks in (1, 3, 17):
        np.testing.assert_array_equal(ray_rows(mixed_corpus, blocks=blocks), reference, err_msg=str(blocks))


@pytest.mark.slow
def test_hundreds_of_short_documents_each_in_its_own_block_pack_exactly(short_notes, joined_ray):
    """The layout in which per-block packing loses every document shorter than a row."""
    files = corpus_files(str(short_notes))
    rows = ray_rows(short_notes, blocks=len(files))
    assert_exact_packing(rows, files, SEQ_LEN)
    assert (rows == EOS).sum() >= len(files) - 1


# --- rows without a usable text column ----------------------------------------------------------

GOOD_ROW = json.dumps({"text": "a good document"})
BAD_ROWS = [
    ('{"id": 7, "body": "no text here"}', "no 'text' column; the row's columns: 'id', 'body'"),
    ("{}", "no 'text' column; the row's columns: none"),
    ('{"text": 42}', "'text' is 42, not a string"),
    ('{"text": null}', "'text' is null, not a string"),
    ('{"text": ""}', "'text' is empty"),
    ("[1, 2]", "[1, 2] is not a JSON object with a 'text' column"),
    ('{"text": "cut', "not JSON at column 10: Unterminated string starting at"),
]


def bad_jsonl(root: Path, row: str) -> Path:
    """A corpus file whose bad row is line 4, after a good row and a blank line."""
    path = root / "rows.jsonl"
    path.write_text(f"{GOOD_ROW}\n\n{GOOD_ROW}\n{row}\n{GOOD_ROW}\n")
    return path


@pytest.mark.parametrize(("row", "problem"), BAD_ROWS)
def test_a_bad_jsonl_row_is_one_line_naming_file_line_and_column(tmp_path, row, problem):
    path = bad_jsonl(tmp_path, row)
    with pytest.raises(UsageError) as raised:
        read_documents(str(path))
    assert str(raised.value) == f"corpus file {path} line 4: {problem}"


def test_jsonl_lines_are_split_at_newlines_only(tmp_path):
    """U+2028 is a line break to str.splitlines, but JSON allows it raw inside a string."""
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": "one\u2028two"}, ensure_ascii=False) + "\n")
    assert read_documents(str(path)) == ["one\u2028two"]


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (pa.table({"body": ["x"], "id": [1]}), ": no 'text' column; its columns: 'body', 'id'"),
        (pa.table({"text": [1, 2]}), ": column 'text' holds int64, not strings"),
        (pa.table({"text": ["fine", None]}), " row index 1: 'text' is null, not a string"),
        (pa.table({"text": ["fine", "also", ""]}), " row index 2: 'text' is empty"),
    ],
)
def test_a_bad_parquet_row_or_column_is_one_line_naming_file_row_and_column(tmp_path, table, problem):
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path)
    with pytest.raises(UsageError) as raised:
        read_documents(str(path))
    assert str(raised.value) == f"corpus file {path}{problem}"


@pytest.mark.slow
def test_ray_data_raises_a_bad_row_on_the_driver_as_the_same_usage_error(tmp_path, joined_ray):
    """The row is parsed in a Ray Data task; raised there, the driver would get Ray's traceback."""
    path = bad_jsonl(tmp_path, BAD_ROWS[0][0])
    with pytest.raises(UsageError) as raised:
        ray_rows(tmp_path)
    assert str(raised.value) == f"corpus file {path} line 4: {BAD_ROWS[0][1]}"
