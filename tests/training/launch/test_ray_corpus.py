"""The corpus on Ray: the driver's packing pass over Ray Data's batches. Ray Data's own reading and
tokenizing, against the in-process path, is tests/training/data/test_packing.py's (slow)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from training.data.documents import PROBLEM_COLUMN, TOKENS_COLUMN
from training.errors import UsageError
from training.launch.ray_corpus import pack_dataset


class Batches:
    """A dataset of ready batches that records whether its batch generator was closed."""

    def __init__(self, *batches: dict[str, np.ndarray]) -> None:
        self.batches, self.closed = batches, False

    def iter_batches(self, batch_format: str) -> Iterator[dict[str, np.ndarray]]:
        assert batch_format == "numpy"
        try:
            yield from self.batches
        finally:
            self.closed = True


def batch(*documents: list[int], problem: str = "") -> dict[str, np.ndarray]:
    tokens = np.empty(len(documents), dtype=object)
    tokens[:] = [np.asarray(document, dtype=np.int64) for document in documents]
    return {TOKENS_COLUMN: tokens, PROBLEM_COLUMN: np.asarray([problem] * len(documents), dtype=object)}


class Packer:
    def __init__(self) -> None:
        self.added: list[list[int]] = []

    def add(self, tokens: np.ndarray) -> None:
        self.added.append(tokens.tolist())


def test_documents_reach_the_packer_in_the_dataset_order_across_batches():
    packer, documents = Packer(), Batches(batch([1, 2], [3]), batch([4, 5, 6]))
    pack_dataset(documents, packer)  # type: ignore[arg-type]
    assert packer.added == [[1, 2], [3], [4, 5, 6]]
    assert documents.closed


def test_a_bad_corpus_file_is_a_usage_error_and_the_batches_are_closed_all_the_same():
    documents = Batches(batch([1]), batch([2], problem="data/bad.jsonl: line 3 is not JSON"), batch([3]))
    packer = Packer()
    with pytest.raises(UsageError, match="line 3 is not JSON"):
        pack_dataset(documents, packer)  # type: ignore[arg-type]
    assert packer.added == [[1]]
    assert documents.closed
