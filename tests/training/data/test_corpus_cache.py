"""The streamed packer and the tokenized-corpus cache (training/data/corpus_cache.py).

The packer must write the rows `pack_documents` builds in memory, bit for bit, with the same
fingerprint, whatever its flush blocks cut; the cache must give a later run those rows without
reading a corpus file or loading a tokenizer, under a key that every input of the rows changes,
and must never trust an entry a stopped run left half written. A `file://` root takes the path
an s3:// one takes (pyarrow streams, a node copy), on the local filesystem pyarrow models it with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

import training.data.corpus_cache as corpus_cache
import training.data.documents as data
import training.data.packing as row_packing
from tests.harness.packing_reference import corpus_rows
from training.config.run_config import SHIPPED_CORPUS, corpus_files, parse_args
from training.data.corpus_cache import (
    META_FILE,
    CorpusCache,
    cache_inputs,
    cache_key,
    cached_rows,
    in_process_rows,
    local_sources,
    open_rows,
    rows_file,
)
from training.data.documents import document_tokens
from training.data.packing import (
    DOCUMENT_START,
    ROW_DTYPE,
    PackingStats,
    RowPacker,
    corpus_fingerprint,
    pack_documents,
)
from training.data.tokenizer import ByteTokenizer
from training.errors import UsageError

SEQ_LEN = 32


def streamed(documents: list[np.ndarray], seq_len: int) -> tuple[np.ndarray, str]:
    written = io.BytesIO()
    packer = RowPacker(written.write, seq_len)
    for tokens in documents:
        packer.add(tokens)
    fingerprint = packer.finish()
    rows = np.frombuffer(written.getvalue(), dtype=ROW_DTYPE).reshape(-1, seq_len + 1)
    assert packer.rows == len(rows)
    return rows, fingerprint


def mixed_documents(attention: str) -> list[np.ndarray]:
    """Text and conversations of many lengths, some longer than a row and than a flush block."""
    tokenizer = ByteTokenizer()
    chat = [{"role": "user", "content": "why?"}, {"role": "assistant", "content": "because " * 5}]
    documents: list[data.Document] = []
    for index in range(40):
        documents.append("word " * (index * 7 % 61))
        if index % 3 == 0:
            documents.append(chat)
    documents.append("a long one " * 50)
    return [document_tokens(document, tokenizer, attention) for document in documents]


@pytest.mark.parametrize("attention", ["packed", "isolated", "auto"])
@pytest.mark.parametrize("block_tokens", [1, 50, 1 << 20])
def test_streamed_rows_and_fingerprint_do_not_depend_on_the_flush_block(attention, block_tokens, monkeypatch):
    """Blocks of 1 and 50 tokens flush in the middle of documents and rows; the isolation carry
    (a document after an isolated one starts afresh) and next-fit's filler cross them."""
    documents = mixed_documents(attention)
    expected = pack_documents(documents, SEQ_LEN)  # one flush block: 1 Mi tokens
    monkeypatch.setattr(row_packing, "PACK_BLOCK_TOKENS", block_tokens)
    rows, fingerprint = streamed(documents, SEQ_LEN)
    np.testing.assert_array_equal(rows, expected)
    assert fingerprint == corpus_fingerprint(expected)
    assert fingerprint == hashlib.sha256(expected.tobytes()).hexdigest()  # the digest checkpoints hold
    if attention != "packed":
        assert (rows & DOCUMENT_START).any()


def test_fewer_tokens_than_a_row_pack_into_no_rows():
    rows, fingerprint = streamed([np.arange(5, dtype=ROW_DTYPE)], SEQ_LEN)
    assert rows.shape == (0, SEQ_LEN + 1) and fingerprint == corpus_fingerprint(rows)


# --- the cache -----------------------------------------------------------------------------------


def config_for(data_path: Path, root: Path | str, *flags: str):
    return parse_args(
        ["--data", str(data_path), "--corpus-cache", str(root), "--seq-len", str(SEQ_LEN), *flags]
    )


@pytest.fixture
def corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.txt").write_text("The first document. " * 20)
    (root / "b.jsonl").write_text(
        "".join(json.dumps({"text": f"note {i}", "body": f"other {i}"}) + "\n" for i in range(30))
    )
    return root


class Counter:
    """Counts the calls of a function it stands in for."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


def test_a_second_run_reads_the_cache_without_reading_or_tokenizing(corpus, tmp_path, monkeypatch):
    config = config_for(corpus, tmp_path / "cache")
    expected = corpus_rows(corpus_files(str(corpus)), tokenizer="bytes", seq_len=SEQ_LEN)
    loads = Counter(data.load_tokenizer)
    reads = Counter(corpus_cache.read_documents)
    monkeypatch.setattr(data, "load_tokenizer", loads)
    monkeypatch.setattr(corpus_cache, "read_documents", reads)
    first = in_process_rows(config, config.data)
    assert (loads.calls, reads.calls) == (1, 2)
    np.testing.assert_array_equal(first, expected)
    assert isinstance(first, np.memmap)
    second = in_process_rows(config, config.data)
    assert (loads.calls, reads.calls) == (1, 2)  # nothing read, no tokenizer loaded
    np.testing.assert_array_equal(second, expected)
    assert corpus_fingerprint(second) == corpus_fingerprint(expected)
    [entry] = [path for path in (tmp_path / "cache").iterdir() if path.is_dir()]
    meta = json.loads((entry / META_FILE).read_text())
    assert meta["rows"] == len(expected) and meta["fingerprint"] == corpus_fingerprint(expected)
    assert (entry / rows_file(0)).stat().st_size == expected.nbytes


def test_the_cache_keeps_what_packing_did_for_a_later_run(tmp_path):
    """A conversation longer than a row is truncated to one and counted; meta.json keeps the
    counts, and a run that reads the entry reports the same."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    long = [{"role": "user", "content": "tell"}, {"role": "assistant", "content": "more " * 20}]
    (tmp_path / "chat.jsonl").write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in [chat, long, chat])
    )
    config = config_for(tmp_path / "chat.jsonl", tmp_path / "cache", "--seq-len", "64")
    first = corpus_cache.in_process_corpus(config)
    lengths = [len(document_tokens(m, ByteTokenizer(), "auto")) for m in (chat, long, chat)]
    assert lengths[1] > 65 > lengths[0] > 65 / 2  # one a row: 3 rows
    assert first.rows.shape == (3, 65)
    assert first.packing == PackingStats(
        documents=3,
        documents_truncated=1,
        tokens_truncated=lengths[1] - 65,
        filler_tokens=2 * (65 - lengths[0]),
    )
    [entry] = [path for path in (tmp_path / "cache").iterdir() if path.is_dir()]
    assert json.loads((entry / META_FILE).read_text())["packing"] == dataclasses.asdict(first.packing)
    again = corpus_cache.in_process_corpus(config)
    assert again.packing == first.packing and again.fingerprint == first.fingerprint


def test_the_default_root_is_beside_the_runs(corpus, tmp_path):
    config = parse_args(["--data", str(corpus), "--storage-path", str(tmp_path / "runs")])
    assert corpus_cache.cache_root(config) == f"{tmp_path / 'runs'}/corpus-cache"


def key_of(config) -> str:
    return cache_key(cache_inputs(config, local_sources(corpus_files(config.data))))


def test_every_input_of_the_rows_changes_the_key(corpus, tmp_path):
    root = tmp_path / "cache"
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    base = config_for(corpus, root)
    keys = {
        "base": key_of(base),
        "seq_len": key_of(dataclasses.replace(base, seq_len=SEQ_LEN * 2)),
        "tokenizer": key_of(dataclasses.replace(base, tokenizer="Qwen/Qwen2.5-1.5B")),
        "tokenizer folder": key_of(dataclasses.replace(base, tokenizer=str(tokenizer))),
        "text column": key_of(dataclasses.replace(base, text_column="body")),
        "attention": key_of(dataclasses.replace(base, document_attention="isolated")),
    }
    (tokenizer / "tokenizer.json").write_text('{"edited": 1}')
    keys["tokenizer folder edited"] = key_of(dataclasses.replace(base, tokenizer=str(tokenizer)))
    (corpus / "c.txt").write_text("one more file")
    keys["file added"] = key_of(base)
    os.utime(corpus / "a.txt", ns=(0, 0))
    keys["file touched"] = key_of(base)
    (corpus / "b.jsonl").write_text('{"text": "shorter"}\n')
    keys["file rewritten"] = key_of(base)
    assert len(set(keys.values())) == len(keys), keys
    assert key_of(base) == key_of(config_for(corpus, tmp_path / "elsewhere"))  # not the root
    # On GPUs `auto` isolates every document: the rows of `isolated`, so the same entry.
    on_gpus = dataclasses.replace(base, use_gpu=True)
    assert key_of(on_gpus) == key_of(dataclasses.replace(base, document_attention="isolated")) != key_of(base)


def entry_folder(config) -> Path:
    return Path(corpus_cache.cache_root(config)) / key_of(config)


def test_a_half_written_entry_is_rebuilt_not_trusted(corpus, tmp_path, monkeypatch):
    config = config_for(corpus, tmp_path / "cache")
    expected = in_process_rows(config, config.data).copy()
    folder = entry_folder(config)
    loads = Counter(data.load_tokenizer)
    monkeypatch.setattr(data, "load_tokenizer", loads)
    (folder / META_FILE).unlink()  # stopped before meta.json: rows alone
    np.testing.assert_array_equal(in_process_rows(config, config.data), expected)
    assert loads.calls == 1
    with open(folder / rows_file(0), "r+b") as rows:  # rows cut short under a complete meta.json
        rows.truncate(expected.nbytes // 2)
    np.testing.assert_array_equal(in_process_rows(config, config.data), expected)
    assert loads.calls == 2


def test_a_pack_that_fails_leaves_no_entry_and_no_partial_file(corpus, tmp_path):
    config = config_for(corpus, tmp_path / "cache")
    sources = local_sources(corpus_files(config.data))

    def failing(packer: RowPacker) -> None:
        packer.add(np.arange(1000, dtype=ROW_DTYPE))
        raise UsageError("corpus file x line 4: 'text' is empty")

    with pytest.raises(UsageError):
        cached_rows(config, sources, failing)
    folder = entry_folder(config)
    assert [path.name for path in folder.iterdir()] == []
    assert CorpusCache(str(tmp_path / "cache")).lookup(key_of(config)) is None


def test_a_uri_root_is_written_through_pyarrow_and_copied_once_per_node(corpus, tmp_path, monkeypatch):
    root = f"file://{tmp_path / 'bucket'}"
    config = config_for(corpus, root)
    sources = local_sources(corpus_files(config.data))
    expected = corpus_rows(corpus_files(str(corpus)), tokenizer="bytes", seq_len=SEQ_LEN)

    def pack(packer: RowPacker) -> None:
        for tokens in pack_documents_tokens(corpus):
            packer.add(tokens)

    entry, reused = cached_rows(config, sources, pack)
    assert not reused and entry.rows == len(expected)
    assert cached_rows(config, sources, pack)[1]
    copies = Counter(CorpusCache.copy_rows_to)
    monkeypatch.setattr(CorpusCache, "copy_rows_to", lambda cache, *args: copies(cache, *args))
    node = tmp_path / "node"
    for _ in range(2):  # two workers of one node
        np.testing.assert_array_equal(open_rows(entry, node), expected)
    assert copies.calls == 1 and (node / f"{entry.key}.bin").stat().st_size == expected.nbytes


def test_rows_in_a_uri_root_are_split_into_objects_a_node_copy_joins(corpus, tmp_path, monkeypatch):
    """Objects of 1000 bytes here (64 GiB in use: pyarrow's S3 upload writes at most 97.7 GiB into
    one), cut mid-row; a missing one makes the entry incomplete."""
    monkeypatch.setattr(corpus_cache, "URI_SHARD_BYTES", 1000)
    config = config_for(corpus, f"file://{tmp_path / 'bucket'}")
    sources = local_sources(corpus_files(config.data))
    expected = corpus_rows(corpus_files(str(corpus)), tokenizer="bytes", seq_len=SEQ_LEN)
    entry, _ = cached_rows(
        config, sources, lambda packer: [packer.add(t) for t in pack_documents_tokens(corpus)]
    )
    folder = tmp_path / "bucket" / entry.key
    sizes = [(folder / rows_file(index)).stat().st_size for index in range(len(entry.shard_sizes))]
    assert sizes == entry.shard_sizes and len(sizes) > 2 and sum(sizes) == expected.nbytes
    assert not (folder / rows_file(len(sizes))).exists()
    np.testing.assert_array_equal(open_rows(entry, tmp_path / "node"), expected)
    (folder / rows_file(1)).unlink()
    assert CorpusCache(entry.root).lookup(entry.key) is None


def pack_documents_tokens(corpus: Path):
    documents = (doc for path in corpus_files(str(corpus)) for doc in data.read_documents(path))
    return data.tokenize(documents, "bytes", "auto")


def test_rows_of_a_local_root_missing_on_a_workers_node_are_one_line(corpus, tmp_path):
    config = config_for(corpus, tmp_path / "cache")
    sources = local_sources(corpus_files(config.data))
    entry, _ = cached_rows(
        config, sources, lambda packer: [packer.add(t) for t in pack_documents_tokens(corpus)]
    )
    (Path(corpus_cache.cache_root(config)) / entry.key / rows_file(0)).unlink()
    with pytest.raises(UsageError, match=r"^--corpus-cache .*: the cached rows are not on this node .*s3://"):
        open_rows(entry)


def test_the_shipped_corpus_packs_into_the_quoted_rows_through_the_cache(tmp_path):
    """docs/training/data.md: 130 rows at seq 128; the same rows the in-memory packing gave."""
    config = parse_args(["--data", str(SHIPPED_CORPUS), "--corpus-cache", str(tmp_path)])
    rows = in_process_rows(config, config.data)
    files = corpus_files(str(SHIPPED_CORPUS))
    assert rows.shape == (130, 129)
    np.testing.assert_array_equal(rows, corpus_rows(files, tokenizer="bytes", seq_len=128))


def test_a_uri_corpus_is_listed_once_sorted_with_sizes_and_times(tmp_path):
    """pyarrow's listing of a prefix (S3's LIST; here its local filesystem) names each file's key."""
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "notes.csv").write_text("not a corpus file")
    sources = corpus_cache.corpus_sources(f"file://{tmp_path}", "--eval-data")
    assert [source.path for source in sources] == [
        f"file://{tmp_path}/a.txt",
        f"file://{tmp_path}/b/two.jsonl",
    ]
    assert [source.size for source in sources] == [3, 14]
    assert sources[0].modified_ns == (tmp_path / "a.txt").stat().st_mtime_ns
    [one] = corpus_cache.corpus_sources(f"file://{tmp_path}/a.txt", "--data")  # one object
    assert one == sources[0]
    with pytest.raises(UsageError, match=r"^--eval-data file://.*/b/two\.jsonl/none: no \.txt/"):
        corpus_cache.corpus_sources(f"file://{tmp_path}/b/two.jsonl/none", "--eval-data")


def _pack_once_logged(config, log: str) -> str:
    """A torchrun rank's `cached_rows`, its packing recorded in `log` (slowed, so both overlap)."""
    import time

    def pack(packer: RowPacker) -> None:
        with open(log, "a") as out:
            out.write("packed\n")
        time.sleep(0.5)
        packer.add(np.arange(10 * (SEQ_LEN + 1), dtype=ROW_DTYPE))

    entry, _ = cached_rows(config, local_sources(corpus_files(config.data)), pack)
    return entry.fingerprint


def test_ranks_sharing_a_local_root_pack_once(corpus, tmp_path):
    """Two processes ask for the same entry at once: one packs under the lock, the other waits and
    reads it (the ranks of a torchrun run)."""
    import multiprocessing

    config = config_for(corpus, tmp_path / "cache")
    log = str(tmp_path / "packs.log")
    with multiprocessing.get_context("fork").Pool(2) as pool:
        fingerprints = pool.starmap(_pack_once_logged, [(config, log)] * 2)
    assert Path(log).read_text() == "packed\n"
    assert fingerprints[0] == fingerprints[1]
