"""The corpus-memory benchmark's paths on a small corpus: each packs the same rows (in memory, or
streamed into a cache entry a worker then maps and draws batches from), and each measurement
reports what its path produced and the memory it added."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.corpus_memory import KINDS, PeakSampler, measure, resident, run_path, write_jsonl_corpus


def test_the_in_memory_and_streamed_paths_pack_the_same_rows_and_the_worker_maps_them(tmp_path):
    """20 documents of 100 tokens in rows of 64 (+1) tokens: 30 full rows either way."""
    in_memory = run_path("in-memory", 20, 100, 64, str(tmp_path), batches=0)
    streamed = run_path("streamed", 20, 100, 64, str(tmp_path), batches=0)
    assert in_memory["rows"] == streamed["rows"] == 30
    worker = run_path("worker", 20, 100, 64, str(tmp_path), batches=3)
    assert (worker["rows"], worker["batches"]) == (30, 3)


def test_the_worker_path_needs_the_streamed_entry_first(tmp_path):
    with pytest.raises(AssertionError, match="streamed path of this size first"):
        run_path("worker", 20, 100, 64, str(tmp_path), batches=1)


def test_a_measurement_names_its_path_and_size_and_the_memory_each_kind_added(tmp_path):
    args = argparse.Namespace(document_tokens=100, seq_len=64, worker_batches=1, object_store_mib=0)
    result = measure(args, "in-memory", 2050, str(tmp_path))
    assert (result["path"], result["tokens"], result["documents"], result["rows"]) == (
        "in-memory",
        2000,
        20,
        30,
    )
    assert result["rows_mib"] == round(30 * 65 * 4 / 2**20, 1) and result["peak_added_mib"] >= 0
    assert {f"{kind}_peak_added_mib" for kind in KINDS} <= set(result)


def test_the_sampler_keeps_each_kinds_peak_from_its_start():
    assert set(resident()) == set(KINDS)  # Linux names each kind in /proc/self/status
    with PeakSampler() as sampler:
        held = bytearray(64 * 2**20)
        held[::4096] = b"x" * len(held[::4096])  # touch every page
        sampler._done.wait(0.2)
    assert sampler.added_mib()["RssAnon_peak_added_mib"] >= 32
    del held


def test_the_ray_corpus_is_whole_documents_of_the_byte_tokenizers_length(tmp_path):
    path = tmp_path / "corpus.jsonl"
    write_jsonl_corpus(path, 1050, 100)
    lines = path.read_text().splitlines()
    assert len(lines) == 10
    assert {len(json.loads(line)["text"]) for line in lines} == {99}  # with its EOS: 100 tokens
