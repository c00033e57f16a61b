"""`python -m examples.instruction_data OUT_DIR`: a small instruction dataset in the chat format.

Writes `train.jsonl` and `eval.jsonl`, one conversation per line (`{"messages": [{"role": "user",
...}, {"role": "assistant", ...}]}`), the format `python -m training --data` reads for chat data.
The tasks (greet a name, spell a word in capitals, add two numbers, repeat a word) are generated
from a seed, so the worked fine-tune in docs/training/fine-tune.md runs with no download, and the held-out
conversations use names, words and numbers the training ones never do: a falling eval loss is
the model learning the tasks, not recalling rows.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = [
    "Ada",
    "Alan",
    "Alice",
    "Amir",
    "Anna",
    "Ben",
    "Bruno",
    "Carla",
    "Chen",
    "Clara",
    "Dana",
    "David",
    "Elena",
    "Emil",
    "Eva",
    "Farah",
    "Felix",
    "Grace",
    "Hana",
    "Hugo",
    "Ines",
    "Ivan",
    "Jonas",
    "Julia",
    "Kai",
    "Kofi",
    "Lena",
    "Leo",
    "Lina",
    "Luca",
    "Maya",
    "Milo",
    "Nadia",
    "Nina",
    "Omar",
    "Oscar",
    "Paula",
    "Pedro",
    "Rosa",
    "Ruth",
    "Sami",
    "Sara",
    "Tariq",
    "Theo",
    "Uma",
    "Vera",
    "Yara",
    "Yuki",
    "Zane",
    "Zoe",
]
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "bread",
    "lamp",
    "garden",
    "window",
    "forest",
    "candle",
    "harbor",
    "violin",
    "pepper",
    "meadow",
    "rocket",
    "tunnel",
    "marble",
    "spider",
    "pillow",
    "silver",
    "basket",
    "planet",
    "summer",
    "winter",
    "engine",
    "island",
    "copper",
    "feather",
    "mirror",
    "button",
    "pencil",
    "ladder",
    "orange",
    "tiger",
    "falcon",
    "lemon",
    "walnut",
    "anchor",
    "bridge",
    "castle",
    "desert",
    "finger",
    "guitar",
    "hammer",
    "jacket",
    "kettle",
    "lizard",
    "magnet",
    "needle",
    "paddle",
]
EVAL_SHARE = 5  # every fifth name and word is held out for evaluation


def _conversation(user: str, assistant: str) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def conversation(generator: random.Random, names: list[str], words: list[str], numbers: range) -> dict:
    """One task, drawn from the given names, words and numbers."""
    task = generator.randrange(4)
    if task == 0:
        name = generator.choice(names)
        return _conversation(f"Say hello to {name}.", f"Hello, {name}! Nice to meet you.")
    if task == 1:
        word = generator.choice(words)
        return _conversation(f"Write {word} in capital letters.", word.upper())
    if task == 2:
        left, right = generator.choice(numbers), generator.choice(numbers)
        return _conversation(f"What is {left} plus {right}?", f"{left} plus {right} is {left + right}.")
    word, times = generator.choice(words), generator.randrange(2, 5)
    return _conversation(f"Repeat {word} {times} times.", " ".join([word] * times))


def write_dataset(out: Path, *, train_rows: int, eval_rows: int, seed: int) -> None:
    """`train.jsonl` and `eval.jsonl` under `out`; held-out names, words and numbers only in eval."""
    held_out_names, names = NAMES[::EVAL_SHARE], [n for i, n in enumerate(NAMES) if i % EVAL_SHARE]
    held_out_words, words = WORDS[::EVAL_SHARE], [w for i, w in enumerate(WORDS) if i % EVAL_SHARE]
    out.mkdir(parents=True, exist_ok=True)
    generator = random.Random(seed)
    for name, rows, split in (
        ("train.jsonl", train_rows, (names, words, range(50))),
        ("eval.jsonl", eval_rows, (held_out_names, held_out_words, range(50, 100))),
    ):
        lines = (json.dumps(conversation(generator, *split)) for _ in range(rows))
        (out / name).write_text("".join(line + "\n" for line in lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("out", type=Path, help="folder to write train.jsonl and eval.jsonl into")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--eval-rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_dataset(args.out, train_rows=args.train_rows, eval_rows=args.eval_rows, seed=args.seed)
    print(f"wrote {args.out / 'train.jsonl'} ({args.train_rows} rows) and {args.out / 'eval.jsonl'}")


if __name__ == "__main__":
    main()
