"""Training data as rows of `seq_len + 1` token ids (inputs are row[:-1], labels row[1:]).

Synthetic rows reproduce the reference job (uniform random ids). Real text is
tokenized per document, each document followed by an end-of-document token, and
the whole token stream, in corpus order, is cut into fixed rows ("packing"), so no
compute is spent on padding and only the last partial row is dropped. Packing sees
the ordered stream once, so rows do not depend on how the documents were split
into blocks or tasks: Ray Data (which tokenizes in parallel) and the in-process
torchrun reader give the same rows. Each epoch then deals the rows to the ranks
in a fresh seeded order, so the few rows that do not fill a global batch differ
from epoch to epoch, and a resumed run can replay the exact batches it missed.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from training.config import corpus_format
from training.errors import UsageError
from training.tokenizer import load_tokenizer

TOKENS_COLUMN = "tokens"
TEXT_COLUMN = "text"
PROBLEM_COLUMN = "problem"  # between Ray Data's tasks: why a corpus file has no documents
# Token ids as stored between packing and training: every vocabulary fits, at half
# the memory of int64. Batches leave as int64, which the loss needs for labels.
ROW_DTYPE = np.int32


def synthetic_batches(
    *,
    seed: int,
    rank: int,
    start_step: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    grad_accum_steps: int = 1,
) -> Iterator[np.ndarray]:
    """Random token rows, `grad_accum_steps` batches per step from step `start_step + 1` on;
    micro-batch m of step k of rank r is the same on every run, so resumed runs match.
    Micro-batch 0 keeps the key of the rows before accumulation existed, (seed, rank, step),
    so runs without accumulation (and their resumes) see the same rows as before."""
    for step in itertools.count(start_step + 1):
        for micro in range(grad_accum_steps):
            key = [seed, rank, step] if micro == 0 else [seed, rank, step, micro]
            generator = np.random.default_rng(key)
            yield generator.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int64)


def _text_problem(value: object) -> str | None:
    """Why a row's text value is no document (null, not a string, empty), or None."""
    if isinstance(value, str):
        return None if value else "is empty"
    return f"is {json.dumps(value)[:40]}, not a string"


def _jsonl_documents(path: str, raw: bytes) -> list[str]:
    """One document per non-blank line. Lines are split at "\n" only, as JSON Lines defines
    them: a document may hold other line separators (U+2028), and the numbers match an editor's."""
    documents = []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"corpus file {path} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not JSON at column {error.colno}: {error.msg}") from None
        if not isinstance(row, dict):
            raise UsageError(
                f"{where}: {json.dumps(row)[:40]} is not a JSON object with a {TEXT_COLUMN!r} column"
            )
        if TEXT_COLUMN not in row:
            columns = ", ".join(map(repr, row)) or "none"
            raise UsageError(f"{where}: no {TEXT_COLUMN!r} column; the row's columns: {columns}")
        problem = _text_problem(row[TEXT_COLUMN])
        if problem:
            raise UsageError(f"{where}: {TEXT_COLUMN!r} {problem}")
        documents.append(row[TEXT_COLUMN])
    return documents


def _parquet_documents(path: str, raw: bytes) -> list[str]:
    """One document per row of the text column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(raw))
    where = f"corpus file {path}"
    names = parquet.schema_arrow.names
    if TEXT_COLUMN not in names:
        columns = ", ".join(map(repr, names)) or "none"
        raise UsageError(f"{where}: no {TEXT_COLUMN!r} column; its columns: {columns}")
    column = parquet.read(columns=[TEXT_COLUMN]).column(TEXT_COLUMN)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise UsageError(f"{where}: column {TEXT_COLUMN!r} holds {column.type}, not strings")
    texts = column.to_pylist()
    for index, text in enumerate(texts):
        problem = _text_problem(text)
        if problem:
            raise UsageError(f"{where} row index {index}: {TEXT_COLUMN!r} {problem}")
    return texts


def parse_documents(path: str, raw: bytes) -> list[str]:
    """The documents in one corpus file's bytes: a text file is one document, each
    jsonl line or parquet row is one. `path` may be a URI; only its suffix is used.
    A row without a usable text column is a usage error naming file, row and column."""
    kind = corpus_format(path)
    if kind == "text":
        return [raw.decode("utf-8", errors="replace")]
    if kind == "json":
        return _jsonl_documents(path, raw)
    return _parquet_documents(path, raw)


def read_documents(path: str) -> list[str]:
    """The documents of one local corpus file."""
    return parse_documents(path, Path(path).read_bytes())


def tokenize(texts: Iterable[str], tokenizer: str) -> Iterator[np.ndarray]:
    """One token array per document, without the end-of-document token (packing adds it)."""
    encoder = load_tokenizer(tokenizer)
    for text in texts:
        yield np.asarray(encoder.encode(str(text)), dtype=ROW_DTYPE)


def parse_files_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: corpus files' bytes (`read_binary_files` with
    paths) to their documents, in order. Here, not in the launcher, so Ray Data's task
    processes import numpy only, not torch. A file with a bad row becomes one row whose
    problem column names it, which the driver raises: raised here, it would reach the
    driver as Ray Data's traceback of its task, without the error's type."""
    texts: list[str] = []
    problems: list[str] = []
    for path, raw in zip(batch["path"], batch["bytes"], strict=True):
        try:
            documents, problem = parse_documents(path, raw), ""
        except UsageError as error:
            documents, problem = [""], str(error)
        texts.extend(documents)
        problems.extend([problem] * len(documents))
    return {TEXT_COLUMN: np.asarray(texts, dtype=object), PROBLEM_COLUMN: np.asarray(problems, dtype=object)}


def tokenize_batch(batch: dict[str, np.ndarray], *, tokenizer: str) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: one token array per document; problems pass through."""
    column = np.empty(len(batch[TEXT_COLUMN]), dtype=object)
    # Element by element: equal-length arrays would otherwise become one 2-D array.
    for index, tokens in enumerate(tokenize(batch[TEXT_COLUMN], tokenizer)):
        column[index] = tokens
    return {TOKENS_COLUMN: column, PROBLEM_COLUMN: batch[PROBLEM_COLUMN]}


def batch_tokens(batch: dict[str, np.ndarray]) -> np.ndarray:
    """A tokenized batch's token arrays; the usage error of its first bad file, if any."""
    problem = next((problem for problem in batch[PROBLEM_COLUMN] if problem), None)
    if problem:
        raise UsageError(str(problem))
    return batch[TOKENS_COLUMN]


def pack_documents(token_lists: Iterable[np.ndarray | list[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """Concatenate documents in order, each followed by EOS, and cut rows of seq_len + 1;
    only the final partial row is dropped."""
    end = np.asarray([eos_id], dtype=ROW_DTYPE)
    pieces: list[np.ndarray] = []
    for tokens in token_lists:
        pieces.append(np.asarray(tokens, dtype=ROW_DTYPE))
        pieces.append(end)
    stream = np.concatenate(pieces) if pieces else np.empty(0, dtype=ROW_DTYPE)
    row_length = seq_len + 1
    rows = len(stream) // row_length
    return stream[: rows * row_length].reshape(rows, row_length)


def corpus_rows(files: list[str], *, tokenizer: str, seq_len: int) -> np.ndarray:
    """Packed rows of local corpus files, read and tokenized in this process."""
    documents = (document for path in files for document in read_documents(path))
    return pack_documents(tokenize(documents, tokenizer), seq_len, load_tokenizer(tokenizer).eos_id)


def batches_per_epoch(rows: int, *, world_size: int, batch_size: int, seq_len: int) -> int:
    """Steps in one pass over the rows; an error when the corpus cannot fill one step."""
    batches = rows // (world_size * batch_size)
    if batches == 0:
        raise ValueError(
            f"the corpus packs into {rows} rows of {seq_len + 1} tokens: too few for "
            f"{world_size} workers x batch {batch_size}"
        )
    return batches


def epoch_order(rows: int, *, seed: int, epoch: int) -> np.ndarray:
    """The order rows are visited in during one epoch: the same on every rank and every run."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


def epoch_batches(
    rows: np.ndarray,
    *,
    seed: int,
    rank: int,
    world_size: int,
    batch_size: int,
    start: tuple[int, int] = (0, 0),
) -> Iterator[np.ndarray]:
    """This rank's endless stream of [batch, seq_len + 1] int64 batches. Each epoch takes the rows
    in `epoch_order` and cuts global batches of `batch_size x world_size` off it, from sample
    `offset` of epoch `epoch` (`start`) on; each global batch deals its rows to the ranks in
    turn (its row i to rank i mod world); the rows left that do not fill one are left over.
    The position is a global sample index, so a run resumed on another worker count continues
    with the rows the interrupted one had not reached."""
    batches_per_epoch(len(rows), world_size=world_size, batch_size=batch_size, seq_len=rows.shape[1] - 1)
    global_batch = batch_size * world_size
    epoch, offset = start
    while True:
        order = epoch_order(len(rows), seed=seed, epoch=epoch)
        for first in range(offset, len(rows) - global_batch + 1, global_batch):
            yield rows[order[first + rank : first + global_batch : world_size]].astype(np.int64)
        epoch, offset = epoch + 1, 0


def position_after(
    start: tuple[int, int], batches: int, *, rows: int, world_size: int, batch_size: int
) -> tuple[int, int]:
    """The (epoch, sample offset) `epoch_batches` reaches after `batches` batches from `start`."""
    global_batch = batch_size * world_size
    epoch, offset = start
    left = (rows - offset) // global_batch
    while batches >= left:
        batches -= left
        epoch, offset, left = epoch + 1, 0, rows // global_batch
    return epoch, offset + batches * global_batch


def corpus_fingerprint(rows: np.ndarray) -> str:
    """A digest of the packed rows: it changes with the corpus, the tokenizer and --seq-len, each
    of which makes a saved data position name other rows."""
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()


def local_corpus_batches(
    files: list[str], *, tokenizer: str, seq_len: int, batch_size: int, seed: int, rank: int, world_size: int
) -> Iterator[np.ndarray]:
    """Endless epochs over local corpus files read in this process, from the first batch."""
    rows = corpus_rows(files, tokenizer=tokenizer, seq_len=seq_len)
    return epoch_batches(rows, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
