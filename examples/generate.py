"""`python -m examples.generate MODEL_DIR "a question"`: an exported model's answer, greedy.

Loads a Hugging Face folder written by `--export-hf` or `python -m training.export` with
`from_pretrained`, renders the question as a one-turn conversation with the run's tokenizer's chat
template (the byte tokenizer's own for the tiny CPU model), and prints the assistant's reply:
generation stops at the template's end of turn (`training.data.documents.end_of_turn`: Qwen2.5's
`<|im_end|>`, the byte tokenizer's `<|end|>`) or at the EOS, whichever comes first.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from training.config.presets import BYTE_TOKENIZER


def stops_at(marker: list[int], prompt_length: int) -> Any:
    """A `generate()` stopping criterion: the reply ends with `marker` (a token sequence)."""
    import torch
    from transformers import StoppingCriteria

    class EndsWith(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            if marker and input_ids.shape[1] - prompt_length >= len(marker):
                done = (input_ids[:, -len(marker) :] == torch.tensor(marker, device=input_ids.device)).all(
                    dim=1
                )
            return done

    return EndsWith()


def answer(model_dir: str, question: str, *, tokenizer: str, max_new_tokens: int) -> str:
    """The model's greedy reply to `question`, rendered with `tokenizer`'s chat template, up to its
    end of turn (not included)."""
    import torch
    from transformers import AutoModelForCausalLM, StoppingCriteriaList

    from training.data.documents import end_of_turn
    from training.data.tokenizer import load_tokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    encoder = load_tokenizer(tokenizer)
    prompt = encoder.render_chat([{"role": "user", "content": question}], generation_prompt=True)
    prompt_ids = torch.tensor([encoder.encode(prompt)])
    marker = end_of_turn(encoder)
    with torch.no_grad():
        output = model.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=encoder.eos_id,
            pad_token_id=encoder.eos_id,
            stopping_criteria=StoppingCriteriaList([stops_at(marker, prompt_ids.shape[1])]),
        )
    reply = output[0, prompt_ids.shape[1] :].tolist()
    if marker and reply[-len(marker) :] == marker:
        reply = reply[: -len(marker)]
    return encoder.decode(reply).strip()


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
