"""Training data as rows of `seq_len + 1` token ids (inputs are row[:-1], labels row[1:]).

Synthetic rows reproduce the reference job (uniform random ids). Real text is
tokenized, joined with an end-of-document token and cut into fixed rows
("packing"), so no compute is spent on padding. The same packing runs inside
Ray Data on the cluster and in-process under torchrun.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from training.config import corpus_format
from training.tokenizer import load_tokenizer

TOKENS_COLUMN = "tokens"
TEXT_COLUMN = "text"


def synthetic_batches(
    *, seed: int, rank: int, start_step: int, batch_size: int, seq_len: int, vocab_size: int
) -> Iterator[np.ndarray]:
    """Random token rows; step k of rank r is the same on every run, so resumed runs match."""
    for step in itertools.count(start_step + 1):
        generator = np.random.default_rng([seed, rank, step])
        yield generator.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int64)


def pack_documents(token_lists: Iterable[list[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """Concatenate documents, each followed by EOS, into rows of seq_len + 1; drop the tail."""
    stream: list[int] = []
    for tokens in token_lists:
        stream.extend(tokens)
        stream.append(eos_id)
    row_length = seq_len + 1
    rows = len(stream) // row_length
    return np.asarray(stream[: rows * row_length], dtype=np.int64).reshape(rows, row_length)


def tokenize_and_pack(batch: dict[str, np.ndarray], *, tokenizer: str, seq_len: int) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: a batch of documents in, a batch of packed rows out."""
    encoder = load_tokenizer(tokenizer)
    rows = pack_documents((encoder.encode(str(text)) for text in batch[TEXT_COLUMN]), seq_len, encoder.eos_id)
    return {TOKENS_COLUMN: rows}


def decode_text_files(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: raw file bytes to one text document per file."""
    texts = [bytes(raw).decode("utf-8", errors="replace") for raw in batch["bytes"]]
    return {TEXT_COLUMN: np.asarray(texts, dtype=object)}


def read_documents(path: str) -> Iterator[str]:
    """Documents of one corpus file without Ray: a text file is one document, jsonl/parquet rows are."""
    kind = corpus_format(path)
    if kind == "text":
        yield Path(path).read_text(encoding="utf-8", errors="replace")
    elif kind == "json":
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)[TEXT_COLUMN]
    else:
        import pyarrow.parquet as pq

        yield from pq.read_table(path, columns=[TEXT_COLUMN]).column(TEXT_COLUMN).to_pylist()


def local_corpus_batches(
    files: list[str], *, tokenizer: str, seq_len: int, batch_size: int, rank: int, world_size: int
) -> Iterator[np.ndarray]:
    """Endless epochs over a corpus read in-process (torchrun); row i goes to rank i mod world."""
    encoder = load_tokenizer(tokenizer)
    documents = (document for path in files for document in read_documents(path))
    rows = pack_documents((encoder.encode(text) for text in documents), seq_len, encoder.eos_id)
    usable = len(rows) // world_size * world_size
    mine = rows[:usable][rank::world_size]
    batches = len(mine) // batch_size
    if batches == 0:
        raise ValueError(
            f"corpus gives {len(rows)} rows of {seq_len + 1} tokens: too few for "
            f"{world_size} workers x batch {batch_size}"
        )
    while True:
        for index in range(batches):
            yield mine[index * batch_size : (index + 1) * batch_size]
