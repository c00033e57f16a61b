"""Documents' stored tokens packed into rows of `seq_len + 1` token ids (inputs are row[:-1], labels
row[1:]), and the flags the rows carry.

The documents (training/data/documents.py), in corpus order, are laid into fixed rows
("packing"). A document that attends only to itself (an isolated one: a conversation, or any
document under --document-attention isolated) is kept whole: when it does not fit the rest of a
row, filler that carries no loss ends that row and the document starts the next ("next-fit",
streaming and in corpus order). A conversation longer than a row is truncated to a row; an
isolated text longer than a row starts a row and runs on into the next ones, as pretraining text
does. Text packed across documents (--document-attention packed) is cut into rows wherever they
end, so no compute is spent on filler and only the last partial row is dropped. Packing sees the
ordered stream once, so rows do not depend on how the documents were split into blocks or tasks:
Ray Data (which tokenizes in parallel) and the in-process torchrun reader give the same rows. Runs
pack with `RowPacker`, which writes rows as the documents arrive (into the corpus cache,
training/data/corpus_cache.py); `pack_documents` is the same packer into memory. How the rows are
dealt to the ranks, epoch by epoch, is training/data/batches.py's.

A conversation's tokens outside the assistant's turns are stored with a NO_LOSS flag, and a
document that is to attend only to itself starts with a DOCUMENT_START flag, both above the token
id, so the packed rows carry them without extra memory and `training.model.causal_lm.model_batch`
turns them into labels and position ids.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

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


def corpus_fingerprint(rows: np.ndarray) -> str:
    """A digest of the packed rows: it changes with the corpus, the tokenizer and --seq-len, each
    of which makes a saved data position name other rows. `RowPacker` computes the same digest
    while it writes the rows, which is what runs record."""
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
