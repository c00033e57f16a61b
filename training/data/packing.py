"""Training data as rows of `seq_len + 1` token ids (inputs are row[:-1], labels row[1:]).

Synthetic rows reproduce the reference job (uniform random ids). Real text is
tokenized per document, each document followed by an end-of-document token, and
the documents, in corpus order, are laid into fixed rows ("packing"). A document that
attends only to itself (an isolated one: a conversation, or any document under
--document-attention isolated) is kept whole: when it does not fit the rest of a row, filler
that carries no loss ends that row and the document starts the next ("next-fit", streaming and in
corpus order). A conversation longer than a row is truncated to a row; an isolated text longer
than a row starts a row and runs on into the next ones, as pretraining text does. Text packed across documents
(--document-attention packed) is cut into rows wherever they end, so no compute is spent on
filler and only the last partial row is dropped. Packing sees the ordered stream once, so rows do
not depend on how the documents were split into blocks or tasks: Ray Data (which tokenizes in
parallel) and the in-process torchrun reader give the same rows. Runs pack with `RowPacker`, which
writes rows as the documents arrive (into the corpus cache, training/data/corpus_cache.py);
`pack_documents` is the same packer into memory. Each epoch then deals the rows to the ranks
in a fresh seeded order, so the few rows that do not fill a global batch differ
from epoch to epoch, and a resumed run can replay the exact batches it missed.

A conversation (a row's "messages") is rendered with the tokenizer's chat template; its tokens
outside the assistant's turns are stored with a NO_LOSS flag, and a document that is to attend
only to itself starts with a DOCUMENT_START flag, both above the token id, so the packed rows
carry them without extra memory and `training.model.causal_lm.model_batch` turns them into labels and
position ids.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from training.config.corpus_files import DEFAULT_TEXT_COLUMN, corpus_format
from training.data.tokenizer import Message, Tokenizer, load_tokenizer
from training.errors import UsageError

TOKENS_COLUMN = "tokens"
TEXT_COLUMN = "text"  # between Ray Data's tasks: a text document, or "" for a conversation
MESSAGES_COLUMN = "messages"  # a corpus row's conversation; between tasks as JSON, or ""
PROBLEM_COLUMN = "problem"  # between Ray Data's tasks: why a corpus file has no documents
# Token ids as stored between packing and training: every vocabulary fits, at half
# the memory of int64. Batches leave as int64, which the loss needs for labels.
ROW_DTYPE = np.int32
# Two flags ride above each stored token id (every vocabulary is below 2**29), so a packed row
# says which tokens are loss targets and where documents restart at no extra memory.
NO_LOSS = 1 << 30  # not a loss target: a conversation's tokens outside the assistant's turns
DOCUMENT_START = 1 << 29  # positions restart here and nothing before is attended to
TOKEN_ID = DOCUMENT_START - 1
# Tokens the streamed packer gathers before it writes their full rows (4 MiB of int32): its
# working memory, beside one document, whatever the corpus size.
PACK_BLOCK_TOKENS = 1 << 20

Document = str | list[Message]  # a text, or a conversation's messages


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


def _messages_problem(value: object) -> str | None:
    """Why a row's messages are no conversation to train on, or None."""
    if not isinstance(value, list):
        return f"is {json.dumps(value, default=str)[:40]}, not a list of messages"
    if not value:
        return "is empty"
    for index, message in enumerate(value):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            shown = json.dumps(message, default=str)[:60]
            return f"item {index} is {shown}, not an object with string 'role' and 'content'"
    if not any(message["role"] == "assistant" for message in value):
        return "holds no assistant message, so no token to train on"
    return None


def _row_document(row: dict, text_column: str) -> tuple[Document, str | None]:
    """A row's document (its text column, else its conversation) and, when it is none, why."""
    for column, problem_of in ((text_column, _text_problem), (MESSAGES_COLUMN, _messages_problem)):
        if column in row:
            problem = problem_of(row[column])
            return row[column], problem and f"{column!r} {problem}"
    columns = ", ".join(map(repr, row)) or "none"
    return "", f"no {text_column!r} column; the row's columns: {columns}"


def _jsonl_documents(path: str, raw: bytes, text_column: str) -> list[Document]:
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
                f"{where}: {json.dumps(row)[:40]} is not a JSON object with a {text_column!r} column"
            )
        document, problem = _row_document(row, text_column)
        if problem:
            raise UsageError(f"{where}: {problem}")
        documents.append(document)
    return documents


def _parquet_documents(path: str, raw: bytes, text_column: str) -> list[Document]:
    """One document per row of the text column, else of the "messages" column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(raw))
    where = f"corpus file {path}"
    names = parquet.schema_arrow.names
    if text_column in names:
        column, problem_of = text_column, _text_problem
    elif MESSAGES_COLUMN in names:
        column, problem_of = MESSAGES_COLUMN, _messages_problem
    else:
        columns = ", ".join(map(repr, names)) or "none"
        raise UsageError(f"{where}: no {text_column!r} column; its columns: {columns}")
    values = parquet.read(columns=[column]).column(column)
    is_text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    if column == text_column and not is_text:
        raise UsageError(f"{where}: column {column!r} holds {values.type}, not strings")
    documents = values.to_pylist()
    for index, document in enumerate(documents):
        problem = problem_of(document)
        if problem:
            raise UsageError(f"{where} row index {index}: {column!r} {problem}")
    return documents


def parse_documents(path: str, raw: bytes, text_column: str = DEFAULT_TEXT_COLUMN) -> list[Document]:
    """The documents in one corpus file's bytes: a text file is one document, each
    jsonl line or parquet row is one. `path` may be a URI; only its suffix is used.
    A row without a usable text column (or conversation) is a usage error naming file,
    row and column."""
    kind = corpus_format(path)
    if kind == "text":
        return [raw.decode("utf-8", errors="replace")]
    if kind == "json":
        return _jsonl_documents(path, raw, text_column)
    return _parquet_documents(path, raw, text_column)


def read_documents(path: str, text_column: str = DEFAULT_TEXT_COLUMN) -> list[Document]:
    """The documents of one local corpus file."""
    return parse_documents(path, Path(path).read_bytes(), text_column)


def chat_segments(messages: list[Message], render: Callable[..., str]) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, is the assistant's) pieces. An assistant turn
    is what rendering it adds to the prompt before it, which already holds the template's opening
    of an assistant turn, so the loss covers the turn's content and end-of-turn marker only.
    `render(messages, generation_prompt=...)` is the tokenizer's chat template."""
    segments: list[tuple[str, bool]] = []
    done = ""

    def extend_to(text: str, assistant: bool) -> None:
        nonlocal done
        if not text.startswith(done):
            raise UsageError(
                "the tokenizer's chat template renders a conversation otherwise than its first "
                "turns, so the assistant's tokens cannot be told apart"
            )
        added = text[len(done) :]
        if segments and segments[-1][1] == assistant:  # one piece per run, tokenized as one
            segments[-1] = (segments[-1][0] + added, assistant)
        elif added:
            segments.append((added, assistant))
        done = text

    for index, message in enumerate(messages):
        assistant = message["role"] == "assistant"
        if assistant and index:
            extend_to(render(messages[:index], generation_prompt=True), False)
        extend_to(render(messages[: index + 1], generation_prompt=False), assistant)
    return segments


# An answer that no chat template alters, to find where a template ends an assistant turn.
PROBE_ANSWER = "Probe answer."


def end_of_turn(tokenizer: Tokenizer) -> list[int]:
    """The tokens the tokenizer's chat template closes an assistant turn with: what rendering a
    turn adds after its content, without the white space after it (Qwen2.5's `<|im_end|>`, one
    token; the byte tokenizer's `<|end|>`, seven). None for a tokenizer without a template, or a
    template that does not render the content as given."""
    conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": PROBE_ANSWER}]
    try:
        segments = chat_segments(conversation, tokenizer.render_chat)
    except UsageError:
        return []
    turn = "".join(text for text, assistant in segments if assistant)
    if PROBE_ANSWER not in turn:
        return []
    marker = turn[turn.index(PROBE_ANSWER) + len(PROBE_ANSWER) :].strip()
    return tokenizer.encode(marker) if marker else []


def document_tokens(document: Document, tokenizer: Tokenizer, attention: str) -> np.ndarray:
    """A document's stored tokens, its end-of-document token included, with their flags:
    a conversation's tokens outside the assistant's turns (and its EOS) are NO_LOSS, and the
    first token is a DOCUMENT_START when the document is to attend only to itself."""
    if isinstance(document, str):
        pieces = [np.asarray(tokenizer.encode(document), dtype=ROW_DTYPE), np.asarray([tokenizer.eos_id])]
        isolated = attention == "isolated"
    else:
        pieces = [
            np.asarray(tokenizer.encode(text), dtype=ROW_DTYPE) | (0 if loss else NO_LOSS)
            for text, loss in chat_segments(document, tokenizer.render_chat)
        ]
        pieces.append(np.asarray([tokenizer.eos_id | NO_LOSS]))
        isolated = attention != "packed"
    tokens = np.concatenate(pieces).astype(ROW_DTYPE)
    if isolated:
        tokens[0] |= DOCUMENT_START
    return tokens


def tokenize(documents: Iterable[Document], tokenizer: str, attention: str) -> Iterator[np.ndarray]:
    """Each document's stored tokens (see `document_tokens`)."""
    encoder = load_tokenizer(tokenizer)
    for document in documents:
        yield document_tokens(document, encoder, attention)


def parse_files_batch(batch: dict[str, np.ndarray], *, text_column: str) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: corpus files' bytes (`read_binary_files` with
    paths) to their documents, in order, a conversation as JSON. Here, not in the launcher,
    so Ray Data's task processes import numpy only, not torch. A file with a bad row becomes
    one row whose problem column names it, which the driver raises: raised here, it would
    reach the driver as Ray Data's traceback of its task, without the error's type."""
    texts: list[str] = []
    conversations: list[str] = []
    problems: list[str] = []
    for path, raw in zip(batch["path"], batch["bytes"], strict=True):
        try:
            documents, problem = parse_documents(path, raw, text_column), ""
        except UsageError as error:
            documents, problem = [""], str(error)
        for document in documents:
            texts.append(document if isinstance(document, str) else "")
            conversations.append("" if isinstance(document, str) else json.dumps(document))
        problems.extend([problem] * len(documents))
    return {
        TEXT_COLUMN: np.asarray(texts, dtype=object),
        MESSAGES_COLUMN: np.asarray(conversations, dtype=object),
        PROBLEM_COLUMN: np.asarray(problems, dtype=object),
    }


def tokenize_batch(batch: dict[str, np.ndarray], *, tokenizer: str, attention: str) -> dict[str, np.ndarray]:
    """Ray Data `map_batches` function: one token array per document. Problems pass through,
    and one met here (a tokenizer without a chat template) joins them."""
    column = np.empty(len(batch[TEXT_COLUMN]), dtype=object)
    problems = batch[PROBLEM_COLUMN].copy()
    encoder = load_tokenizer(tokenizer)
    rows = zip(batch[TEXT_COLUMN], batch[MESSAGES_COLUMN], strict=True)
    # Element by element: equal-length arrays would otherwise become one 2-D array.
    for index, (text, conversation) in enumerate(rows):
        document = json.loads(conversation) if conversation else str(text)
        try:
            column[index] = document_tokens(document, encoder, attention)
        except UsageError as error:
            column[index], problems[index] = np.empty(0, dtype=ROW_DTYPE), str(error)
    return {TOKENS_COLUMN: column, PROBLEM_COLUMN: problems}


def batch_tokens(batch: dict[str, np.ndarray]) -> np.ndarray:
    """A tokenized batch's token arrays; the usage error of its first bad file, if any."""
    problem = next((problem for problem in batch[PROBLEM_COLUMN] if problem), None)
    if problem:
        raise UsageError(str(problem))
    return batch[TOKENS_COLUMN]


@dataclass(frozen=True)
class PackingStats:
    """What packing did to a corpus's documents, for the run's summary. A conversation longer than a
    row is truncated to one row: `documents_truncated` of them, whose `tokens_truncated` tokens past
    the row are dropped (TRL's best-fit packing truncates too, by default: huggingface/trl,
    trl/data_utils.py, `_pack_bfd`); its turns past the row would train without their prompt. An
    isolated text longer than a row, whose every token is a target, runs on across rows instead:
    `documents_split`. `filler_tokens` end rows where the next isolated document did not fit, and
    the last row; they carry no loss."""

    documents: int = 0
    documents_truncated: int = 0
    tokens_truncated: int = 0
    documents_split: int = 0
    filler_tokens: int = 0


def filler(length: int, token: int) -> np.ndarray:
    """`length` tokens that end a row: `token` (the end-of-document token before them), no loss,
    one document of their own, so nothing attends to them and they attend to nothing before."""
    tokens = np.full(length, (token & TOKEN_ID) | NO_LOSS, dtype=ROW_DTYPE)
    if length:
        tokens[0] |= DOCUMENT_START
    return tokens


class RowPacker:
    """Documents' stored tokens (EOS included), in order, into rows of seq_len + 1, written to
    `write` (bytes, row after row) as they fill and hashed into a SHA-256 equal to
    `corpus_fingerprint` of the same rows, so memory holds the tokens of at most one flush block
    and one document, however large the corpus.

    An isolated document (its first token a DOCUMENT_START) is laid whole into the row it fits,
    else into the next, the rest of the row `filler`. One longer than a row starts a row: a
    conversation (it holds tokens that carry no loss, its prompt) is truncated to the row, a text
    runs on into the next rows.
    A document after an isolated one starts afresh too (DOCUMENT_START), so that nothing sees
    into an isolated document; otherwise (packed text) documents run on across rows, and the last
    partial row is dropped. After an isolated document the last row is kept, filled."""

    def __init__(self, write: Callable[[bytes], object], seq_len: int) -> None:
        self._write = write
        self._row_length = seq_len + 1
        self._flush_at = max(self._row_length, PACK_BLOCK_TOKENS)
        self._pieces: list[np.ndarray] = []
        self._pending = 0
        self._used = 0  # tokens in the row being filled
        self._after_isolated = False
        self._last_token = 0  # of the document before: what filler repeats
        self._digest = hashlib.sha256()
        self._counts = dict.fromkeys(
            ("documents", "documents_truncated", "tokens_truncated", "documents_split", "filler_tokens"), 0
        )
        self.rows = 0

    @property
    def stats(self) -> PackingStats:
        return PackingStats(**self._counts)

    def add(self, tokens: np.ndarray | list[int]) -> None:
        """One document's stored tokens (EOS included)."""
        piece = np.array(tokens, dtype=ROW_DTYPE)
        isolated = bool(piece[0] & DOCUMENT_START)
        if self._after_isolated:
            piece[0] |= DOCUMENT_START
        self._after_isolated = isolated
        self._counts["documents"] += 1
        last_token = int(piece[-1])
        if isolated:
            if len(piece) > self._row_length:
                if (piece & NO_LOSS).any():
                    self._counts["documents_truncated"] += 1
                    self._counts["tokens_truncated"] += len(piece) - self._row_length
                    piece = piece[: self._row_length]
                else:
                    self._counts["documents_split"] += 1
            if self._used and len(piece) > self._row_length - self._used:
                self._fill_row()
        self._last_token = last_token
        self._append(piece)

    def _fill_row(self) -> None:
        room = self._row_length - self._used
        self._counts["filler_tokens"] += room
        self._append(filler(room, self._last_token))

    def _append(self, piece: np.ndarray) -> None:
        self._pieces.append(piece)
        self._pending += len(piece)
        self._used = (self._used + len(piece)) % self._row_length
        if self._pending >= self._flush_at:
            self._flush()

    def _flush(self) -> None:
        stream = np.concatenate(self._pieces) if self._pieces else np.empty(0, dtype=ROW_DTYPE)
        full = len(stream) // self._row_length * self._row_length
        if full:
            data = stream[:full].tobytes()
            self._write(data)
            self._digest.update(data)
            self.rows += full // self._row_length
        rest = stream[full:]
        self._pieces, self._pending = [rest], len(rest)

    def finish(self) -> str:
        """Write the last full rows, and the partial one when it ends in an isolated document
        (filled: no conversation is left out); the rows' fingerprint."""
        if self._after_isolated and self._used:
            self._fill_row()
        self._flush()
        self._pieces, self._pending, self._used = [], 0, 0
        return self._digest.hexdigest()


def pack_documents(documents: Iterable[np.ndarray | list[int]], seq_len: int) -> np.ndarray:
    """`RowPacker`'s rows of documents' stored tokens, in memory."""
    written = io.BytesIO()
    packer = RowPacker(written.write, seq_len)
    for tokens in documents:
        packer.add(tokens)
    packer.finish()
    return np.frombuffer(written.getvalue(), dtype=ROW_DTYPE).reshape(-1, seq_len + 1).copy()


class PackedCorpus(NamedTuple):
    """A corpus's packed rows, their `corpus_fingerprint`, which a cache entry stores, so that
    no rank hashes a corpus it maps from disk, and what packing did (`PackingStats`)."""

    rows: np.ndarray
    fingerprint: str
    packing: PackingStats = PackingStats()


def steps_per_epoch(
    rows: int, *, world_size: int, batch_size: int, seq_len: int, grad_accum_steps: int = 1
) -> int:
    """Optimizer steps in one pass over the rows; an error when the corpus cannot fill one step."""
    steps = rows // (world_size * batch_size * grad_accum_steps)
    if steps == 0:
        micro = f" x {grad_accum_steps} micro-batches" if grad_accum_steps > 1 else ""
        raise ValueError(
            f"the corpus packs into {rows} rows of {seq_len + 1} tokens: too few for "
            f"{world_size} workers x batch {batch_size}{micro}"
        )
    return steps


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
    grad_accum_steps: int = 1,
    start: tuple[int, int] = (0, 0),
) -> Iterator[np.ndarray]:
    """This rank's endless stream of [batch, seq_len + 1] int64 micro-batches, `grad_accum_steps`
    per step. Each epoch takes the rows in `epoch_order` and cuts it into steps of
    `batch_size x world_size x grad_accum_steps` rows (the global batch), from sample `offset` of
    epoch `epoch` (`start`) on; micro-batch m of a step takes the step's rows m x batch_size x
    world_size onwards and deals them to the ranks in turn (row i to rank i mod world). The rows
    left that do not fill a step are left over. So a step trains on the same rows whatever the
    split of its global batch into workers and micro-batches (2 x 1 or 1 x 2), and the position is
    a global sample index: a run resumed on another worker count continues with the rows the
    interrupted one had not reached."""
    steps_per_epoch(
        len(rows),
        world_size=world_size,
        batch_size=batch_size,
        seq_len=rows.shape[1] - 1,
        grad_accum_steps=grad_accum_steps,
    )
    micro = batch_size * world_size
    global_batch = micro * grad_accum_steps
    epoch, offset = start
    while True:
        order = epoch_order(len(rows), seed=seed, epoch=epoch)
        for first in range(offset, len(rows) - global_batch + 1, global_batch):
            for low in range(first, first + global_batch, micro):
                yield rows[order[low + rank : low + micro : world_size]].astype(np.int64)
        epoch, offset = epoch + 1, 0


def position_after(start: tuple[int, int], steps: int, *, rows: int, global_batch: int) -> tuple[int, int]:
    """The (epoch, sample offset) `epoch_batches` reaches after `steps` steps of `global_batch`
    rows from `start`."""
    epoch, offset = start
    left = (rows - offset) // global_batch
    while steps >= left:
        steps -= left
        epoch, offset, left = epoch + 1, 0, rows // global_batch
    return epoch, offset + steps * global_batch


def corpus_fingerprint(rows: np.ndarray) -> str:
    """A digest of the packed rows: it changes with the corpus, the tokenizer and --seq-len, each
    of which makes a saved data position name other rows. `RowPacker` computes the same digest
    while it writes the rows, which is what runs record."""
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
