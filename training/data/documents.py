"""A corpus's documents: its files parsed into texts and conversations (each bad row a one-line
error naming file, line and column), and each document tokenized into the stored tokens that
packing (training/data/packing.py) lays into rows.

Real text is tokenized per document, each document followed by an end-of-document token. A
conversation (a row's "messages") is rendered with the tokenizer's chat template; its tokens
outside the assistant's turns are stored with packing's NO_LOSS flag, and a document that is to
attend only to itself starts with its DOCUMENT_START flag. Ray Data's tasks run
`parse_files_batch` and `tokenize_batch`; the in-process torchrun reader runs `read_documents`
and `tokenize`: the same tokens either way.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from training.config.corpus_files import DEFAULT_TEXT_COLUMN, corpus_format
from training.data.packing import DOCUMENT_START, NO_LOSS, ROW_DTYPE
from training.data.tokenizer import Message, Tokenizer, load_tokenizer
from training.errors import UsageError

TOKENS_COLUMN = "tokens"
TEXT_COLUMN = "text"  # between Ray Data's tasks: a text document, or "" for a conversation
MESSAGES_COLUMN = "messages"  # a corpus row's conversation; between tasks as JSON, or ""
PROBLEM_COLUMN = "problem"  # between Ray Data's tasks: why a corpus file has no documents

Document = str | list[Message]  # a text, or a conversation's messages


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
