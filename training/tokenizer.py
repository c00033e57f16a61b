"""Tokenizers: a byte-level one for the tiny model (no download) and Hugging Face's for real models."""

from __future__ import annotations

import functools
from typing import Protocol

from training.config import BYTE_TOKENIZER


class Tokenizer(Protocol):
    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255 and one end-of-document token, 256."""

    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A `transformers` tokenizer, with its EOS token separating packed documents."""

    def __init__(self, name_or_path: str):
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if self._tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {name_or_path!r} has no EOS token to separate documents")
        self.eos_id = self._tokenizer.eos_token_id
        self.vocab_size = len(self._tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def save_pretrained(self, path: str) -> None:
        self._tokenizer.save_pretrained(path)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Tokenizer:
    """Cached: Ray Data calls this once per batch in long-lived worker processes."""
    if name == BYTE_TOKENIZER:
        return ByteTokenizer()
    return HuggingFaceTokenizer(name)
