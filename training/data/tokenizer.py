"""Tokenizers: a byte-level one for the tiny model (no download) and Hugging Face's for real models."""

from __future__ import annotations

import functools
from typing import Protocol

from training.config.presets import BYTE_TOKENIZER
from training.errors import UsageError

Message = dict[str, str]  # one turn of a conversation: {"role": ..., "content": ...}


class Tokenizer(Protocol):
    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def render_chat(self, messages: list[Message], *, generation_prompt: bool) -> str:
        """The conversation as the model reads it; with `generation_prompt`, followed by
        what opens an assistant turn."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255 and one end-of-document token, 256."""

    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[Message], *, generation_prompt: bool) -> str:
        """A minimal ChatML-like template (bytes have none of their own), so that the CPU
        model and the tests train on conversations the way a real tokenizer's template does."""
        turns = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)
        return turns + ("<|assistant|>\n" if generation_prompt else "")


class HuggingFaceTokenizer:
    """A `transformers` tokenizer, with its EOS token separating packed documents."""

    def __init__(self, name_or_path: str):
        from transformers import AutoTokenizer

        self.name = name_or_path
        self._tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if self._tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {name_or_path!r} has no EOS token to separate documents")
        self.eos_id = self._tokenizer.eos_token_id
        self.vocab_size = len(self._tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def render_chat(self, messages: list[Message], *, generation_prompt: bool) -> str:
        if not self._tokenizer.chat_template:
            raise UsageError(
                f"--tokenizer {self.name} has no chat template to render the corpus's conversations "
                "('messages' rows) with: use a tokenizer that has one, or text rows"
            )
        text = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def save_pretrained(self, path: str) -> None:
        self._tokenizer.save_pretrained(path)


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Tokenizer:
    """Cached: Ray Data calls this once per batch in long-lived worker processes."""
    if name == BYTE_TOKENIZER:
        return ByteTokenizer()
    return HuggingFaceTokenizer(name)
