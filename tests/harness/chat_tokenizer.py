"""A Hugging Face tokenizer with a ChatML chat template, built offline: Qwen2.5's turn markers
(`<|im_start|>`, `<|im_end|>`, `<|endoftext|>` as special tokens) over byte-level BPE with no
merges (256 byte tokens), and a tiny Qwen2 architecture whose vocabulary holds it. The training
tests fine-tune and export with it where the byte tokenizer, which has no special tokens, cannot
show what a real tokenizer's end of turn does."""

from __future__ import annotations

import json
from pathlib import Path

from training.config.model_configs import load_model_config

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2.5's template without its default system turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer(folder: Path) -> tuple[str, dict[str, int]]:
    """The tokenizer saved in `folder`, and its special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    byte_level = Tokenizer(
        models.BPE(vocab={symbol: index for index, symbol in enumerate(alphabet)}, merges=[])
    )
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    byte_level.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=byte_level, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)
    fast.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(folder)
    ids = {token: fast.convert_tokens_to_ids(token) for token in (END_OF_TEXT, IM_START, IM_END)}
    return str(folder), ids


def chatml_model_config(path: Path, ids: dict[str, int]) -> str:
    """The tiny architecture with a vocabulary of the tokenizer's size, its EOS the tokenizer's."""
    values = load_model_config("tiny")
    values.update(
        vocab_size=max(ids.values()) + 1, bos_token_id=ids[END_OF_TEXT], eos_token_id=ids[END_OF_TEXT]
    )
    path.write_text(json.dumps(values))
    return str(path)
