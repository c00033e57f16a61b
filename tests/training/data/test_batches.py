"""Rows and batches: packing, synthetic rows, micro-batches, the local corpus split between ranks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.harness.packing_reference import corpus_rows, local_corpus_batches
from training.config.run_config import (
    SHIPPED_CORPUS,
    SYNTHETIC,
    parse_args,
)
from training.data.batches import synthetic_batches
from training.data.documents import read_documents
from training.data.packing import pack_documents


def test_packing_joins_documents_with_eos_and_drops_the_tail():
    rows = pack_documents([[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 10, 0]], seq_len=3)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 10]])


def test_synthetic_batches_depend_only_on_seed_rank_and_step():
    def batches(rank, start_step):
        return synthetic_batches(
            seed=7, rank=rank, start_step=start_step, batch_size=2, seq_len=5, vocab_size=11
        )

    from_start = batches(0, 0)
    first_three = [next(from_start) for _ in range(3)]
    np.testing.assert_array_equal(next(batches(0, 2)), first_three[2])
    assert not np.array_equal(next(batches(1, 0)), first_three[0])
    assert first_three[0].shape == (2, 6) and first_three[0].max() < 11


def test_synthetic_rows_without_accumulation_are_those_of_earlier_runs():
    """Step k of rank r is still keyed (seed, rank, k), so resuming a run that started before
    accumulation existed replays the rows it trained on."""
    batches = synthetic_batches(
        seed=7, rank=1, start_step=4, batch_size=2, seq_len=5, vocab_size=11, grad_accum_steps=1
    )
    for step in (5, 6, 7):
        earlier = np.random.default_rng([7, 1, step]).integers(0, 11, size=(2, 6), dtype=np.int64)
        np.testing.assert_array_equal(next(batches), earlier)


def test_synthetic_micro_batches_are_distinct_and_keyed_by_step_and_micro_batch():
    def batches(start_step, grad_accum_steps):
        return synthetic_batches(
            seed=7,
            rank=0,
            start_step=start_step,
            batch_size=2,
            seq_len=5,
            vocab_size=11,
            grad_accum_steps=grad_accum_steps,
        )

    from_start = batches(0, 3)
    steps = [[next(from_start) for _ in range(3)] for _ in range(3)]
    rows = [batch.tobytes() for step in steps for batch in step]
    assert len(set(rows)) == len(rows), "a micro-batch repeats another"
    # A resume from step 2 draws step 3's micro-batches, in order.
    resumed = batches(2, 3)
    for micro, expected in enumerate(steps[2]):
        np.testing.assert_array_equal(next(resumed), expected, err_msg=str(micro))
    # Micro-batch 0 of a step is that step's rows without accumulation.
    without = batches(0, 1)
    for step in steps:
        np.testing.assert_array_equal(next(without), step[0])


class _RankOnly:
    """The part of a launcher's session `step_batches` reads: rank and world size."""

    rank = 0
    world_size = 1


@pytest.mark.parametrize("data", ["corpus", SYNTHETIC])
def test_a_resume_with_accumulation_replays_the_rows_of_an_uninterrupted_run(data):
    """A run resumed after step 3 of 2 micro-batches each continues with batch 7 of the stream,
    the first batch the uninterrupted run would have trained on after step 3."""
    from training.data.batches import position_after, step_batches

    argv = ["--seq-len", "32", "--batch-size", "3", "--grad-accum-steps", "2"]
    config = parse_args(argv + (["--data", SYNTHETIC] if data == SYNTHETIC else []))
    files = [str(path) for path in sorted(SHIPPED_CORPUS.iterdir())]
    rows = None if data == SYNTHETIC else corpus_rows(files, tokenizer="bytes", seq_len=32)
    uninterrupted = step_batches(config, _RankOnly(), 257, 0, rows, (0, 0))
    per_step = [[next(uninterrupted) for _ in range(2)] for _ in range(6)]
    position = (0, 0) if rows is None else position_after((0, 0), 3, rows=len(rows), global_batch=6)
    resumed = step_batches(config, _RankOnly(), 257, 3, rows, position)
    for step in per_step[3:]:
        for expected in step:
            np.testing.assert_array_equal(next(resumed), expected)
    assert not np.array_equal(per_step[0][0], per_step[0][1])


def test_local_corpus_splits_rows_between_ranks():
    files = [str(path) for path in sorted(SHIPPED_CORPUS.iterdir())]
    per_rank = [
        local_corpus_batches(
            files,
            tokenizer="bytes",
            seq_len=64,
            batch_size=4,
            seed=0,
            rank=rank,
            world_size=2,
            text_column="text",
            attention="auto",
        )
        for rank in (0, 1)
    ]
    first = [next(batches) for batches in per_rank]
    assert first[0].shape == (4, 65)
    assert not np.array_equal(first[0], first[1])


def test_local_corpus_too_small_for_the_batch_is_an_error(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")
    with pytest.raises(ValueError, match="too few"):
        next(
            local_corpus_batches(
                [str(tmp_path / "tiny.txt")],
                tokenizer="bytes",
                seq_len=64,
                batch_size=1,
                seed=0,
                rank=0,
                world_size=1,
                text_column="text",
                attention="auto",
            )
        )


def test_jsonl_documents_are_rows(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert list(read_documents(str(path))) == ["one", "two"]
