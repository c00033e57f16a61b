"""`examples/instruction_data.py`: the worked fine-tune's generated chat data (docs/training/fine-tune.md)."""

from __future__ import annotations

import json
from pathlib import Path

from examples.instruction_data import write_dataset


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_generated_dataset_is_conversations_whose_held_out_rows_use_unseen_values(tmp_path):
    write_dataset(tmp_path, train_rows=400, eval_rows=100, seed=0)
    train, held_out = _rows(tmp_path / "train.jsonl"), _rows(tmp_path / "eval.jsonl")
    assert (len(train), len(held_out)) == (400, 100)
    for row in train + held_out:
        assert [message["role"] for message in row["messages"]] == ["user", "assistant"]
    questions = {row["messages"][0]["content"] for row in train}
    assert not questions & {row["messages"][0]["content"] for row in held_out}
    write_dataset(tmp_path / "again", train_rows=400, eval_rows=100, seed=0)
    assert (tmp_path / "again" / "train.jsonl").read_bytes() == (tmp_path / "train.jsonl").read_bytes()
