"""The tokenizers (training/data/tokenizer.py): the byte tokenizer of the tiny model."""

from __future__ import annotations

from training.config.run_config import load_model_config
from training.data.tokenizer import ByteTokenizer


def test_byte_tokenizer_round_trips_utf8():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("naïve café")
    assert max(ids) < 256 and tokenizer.decode(ids) == "naïve café"
    assert tokenizer.vocab_size == load_model_config("tiny")["vocab_size"]
