"""The in-memory reference of the corpus path: every document read, tokenized and packed in one
array in this process, as the job did before it streamed rows into the corpus cache. Tests hold the
streamed rows, the cache and Ray Data's rows to it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from training.config.corpus_files import DEFAULT_TEXT_COLUMN
from training.data.batches import epoch_batches
from training.data.documents import read_documents, tokenize
from training.data.packing import pack_documents


def corpus_rows(
    files: list[str],
    *,
    tokenizer: str,
    seq_len: int,
    text_column: str = DEFAULT_TEXT_COLUMN,
    attention: str = "auto",
) -> np.ndarray:
    """Packed rows of local corpus files, read and tokenized in this process."""
    documents = (document for path in files for document in read_documents(path, text_column))
    return pack_documents(tokenize(documents, tokenizer, attention), seq_len)


def local_corpus_batches(
    files: list[str],
    *,
    tokenizer: str,
    seq_len: int,
    batch_size: int,
    seed: int,
    rank: int,
    world_size: int,
    text_column: str,
    attention: str,
) -> Iterator[np.ndarray]:
    """Endless epochs over local corpus files read in this process, from the first batch."""
    rows = corpus_rows(
        files, tokenizer=tokenizer, seq_len=seq_len, text_column=text_column, attention=attention
    )
    return epoch_batches(rows, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
