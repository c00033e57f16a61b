"""`python -m examples.generate MODEL_DIR "a question"`: an exported model's answer, greedy.

Loads a Hugging Face folder written by `--export-hf` or `python -m training.export` with
`from_pretrained`, renders the question as a one-turn conversation with the run's tokenizer's chat
template (the byte tokenizer's own for the tiny CPU model), and prints the assistant's reply up to
its end of turn.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from training.config.presets import BYTE_TOKENIZER

# Where the byte tokenizer's template ends a turn (training/data/tokenizer.py); a Hugging Face
# tokenizer's end of turn is a special token, which decoding drops.
BYTE_END_OF_TURN = "<|end|>"


def answer(model_dir: str, question: str, *, tokenizer: str, max_new_tokens: int) -> str:
    """The model's greedy reply to `question`, rendered with `tokenizer`'s chat template."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.data.tokenizer import load_tokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    encoder = load_tokenizer(tokenizer)
    prompt = encoder.render_chat([{"role": "user", "content": question}], generation_prompt=True)
    prompt_ids = torch.tensor([encoder.encode(prompt)])
    with torch.no_grad():
        output = model.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=encoder.eos_id,
            pad_token_id=encoder.eos_id,
        )
    reply = encoder.decode(output[0, prompt_ids.shape[1] :].tolist())
    return reply.split(BYTE_END_OF_TURN)[0].strip()


def run_tokenizer(model_dir: str, flag: str | None) -> str:
    """The tokenizer to render with: the flag, else the export's own (the export saves a Hugging
    Face tokenizer beside the weights), else the byte tokenizer, which saves nothing."""
    if flag:
        return flag
    return model_dir if Path(model_dir, "tokenizer_config.json").is_file() else BYTE_TOKENIZER


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("model_dir", help="a Hugging Face model folder (a run's hf/ folder)")
    parser.add_argument("question")
    parser.add_argument(
        "--tokenizer",
        help=f"the run's --tokenizer (default: the model folder's own, else {BYTE_TOKENIZER!r})",
    )
    parser.add_argument("--max-new-tokens", type=int, default=60)
    args = parser.parse_args(argv)
    tokenizer = run_tokenizer(args.model_dir, args.tokenizer)
    print(answer(args.model_dir, args.question, tokenizer=tokenizer, max_new_tokens=args.max_new_tokens))


if __name__ == "__main__":
    main()
