"""The tokenized corpus, cached beside the runs (no torch, no ray).

Packed rows are written to a file as the documents are tokenized (`RowPacker`), so the driver's
memory does not grow with the corpus, and workers map that file rather than receive an array, so
neither the head's memory nor its object store bounds the corpus. The file is kept under a key
that digests everything the rows depend on (each corpus file's path, size and modification time,
the tokenizer, --seq-len, --text-column, --document-attention and this format's version), so a
later run with the same inputs reads no corpus file and loads no tokenizer.

    <root>/<key>/rows-00000.bin   the rows, int32 little-endian, seq_len + 1 tokens each, row
                                  after row (a URI root: rows-00001.bin ... past 64 GiB)
    <root>/<key>/meta.json        written last: the row count, seq_len, the rows' fingerprint, what
                                  packing did (documents, truncated, filler), the inputs

`<root>` is --corpus-cache, by default `<--storage-path>/corpus-cache` (S3 on the cluster). A
folder without meta.json, or whose rows files are not the sizes meta.json gives (a run that stopped
while packing), is rebuilt, never read. Deleting a key's folder, or the root, clears the cache.
On a node that reads the cache from a URI, one worker per node copies the rows file to the node's
disk under a lock, and every worker of the node maps that copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyarrow import fs as pyarrow_fs

from training.config.corpus_files import CORPUS_SUFFIXES, corpus_files
from training.config.presets import BYTE_TOKENIZER
from training.config.run_config import TrainConfig, is_uri
from training.data.documents import read_documents, tokenize
from training.data.packing import ROW_DTYPE, PackedCorpus, PackingStats, RowPacker
from training.errors import UsageError

# Bump when the rows a given input packs into change (a tokenization or packing rule), so that
# caches of the old rows are no longer found. 2: isolated documents packed whole (next-fit).
FORMAT_VERSION = 2
CACHE_FOLDER = "corpus-cache"  # under --storage-path, unless --corpus-cache names the root
# S3 objects written through pyarrow are uploaded in parts of a fixed 10 MiB, and S3 takes at most
# 10,000 parts, so one object holds at most 97.7 GiB (Arrow's cpp/src/arrow/filesystem/s3fs.cc,
# kPartUploadSize; apache/arrow#41506). Rows in a URI root are split into objects of this size,
# which a node's copy joins again; a local root keeps them in one file.
URI_SHARD_BYTES = 64 << 30
META_FILE = "meta.json"
FILE_DTYPE = np.dtype("<i4")  # ROW_DTYPE as stored; the fingerprint hashes the same bytes
LOCAL_PREFIX = "local://"  # Ray Data's scheme for a file on the driver's node
# Ray's default temp folder, the pods' emptyDir on the node's disk: node copies of cached rows.
NODE_COPIES = Path(tempfile.gettempdir()) / "ray" / CACHE_FOLDER
COPY_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class SourceFile:
    """One corpus file as the cache key sees it: where it is read from, its size and modification
    time (nanoseconds; S3's LastModified for a URI)."""

    path: str
    size: int
    modified_ns: int


def local_sources(files: list[str], prefix: str = "") -> list[SourceFile]:
    """Local corpus files; `prefix` (local://) is how Ray Data must read them."""
    sources = []
    for path in files:
        stat = os.stat(path)
        sources.append(SourceFile(prefix + path, stat.st_size, stat.st_mtime_ns))
    return sources


def remote_sources(uri: str, flag: str) -> list[SourceFile]:
    """The corpus files under a URI (a prefix or one object), sorted, from one listing."""
    filesystem, root = pyarrow_fs.FileSystem.from_uri(uri)
    info = filesystem.get_file_info(root)
    if info.is_file:  # one object; listing it as a folder fails on some filesystems
        found = [info]
    else:
        found = filesystem.get_file_info(pyarrow_fs.FileSelector(root, recursive=True, allow_not_found=True))
    infos = [info for info in found if info.is_file and Path(info.path).suffix in CORPUS_SUFFIXES]
    if not infos:
        raise UsageError(f"{flag} {uri}: no {'/'.join(CORPUS_SUFFIXES)} files there")
    scheme = uri.split("://", 1)[0]
    return [
        SourceFile(f"{scheme}://{info.path}", info.size, info.mtime_ns or 0)
        for info in sorted(infos, key=lambda info: info.path)
    ]


def corpus_sources(data: str, flag: str, *, on_driver_node: bool = True) -> list[SourceFile]:
    """The files of --data/--eval-data in the order every reader takes them (sorted paths).
    `on_driver_node=False`: local files are read by Ray Data tasks elsewhere, through local://."""
    if is_uri(data):
        return remote_sources(data, flag)
    try:
        files = corpus_files(data, flag=flag)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return local_sources(files, "" if on_driver_node else LOCAL_PREFIX)


def tokenizer_identity(tokenizer: str) -> str:
    """The tokenizer as the key sees it: a local folder (or file) by its files' contents, so that
    editing one makes a new key; a name (the byte tokenizer, a Hub id) by the name."""
    path = Path(tokenizer)
    if tokenizer == BYTE_TOKENIZER or not path.exists():
        return tokenizer
    digest = hashlib.sha256()
    for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        digest.update(str(file.relative_to(path) if file != path else file.name).encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return f"sha256:{digest.hexdigest()}"


def cache_inputs(config: TrainConfig, sources: list[SourceFile]) -> dict[str, Any]:
    """Everything the packed rows depend on (local:// aside: the same file on the same node)."""
    return {
        "format": FORMAT_VERSION,
        "files": [
            [source.path.removeprefix(LOCAL_PREFIX), source.size, source.modified_ns] for source in sources
        ],
        "tokenizer": tokenizer_identity(config.tokenizer),
        "seq_len": config.seq_len,
        "text_column": config.text_column,
        "document_attention": config.packing_attention,
    }


def rows_file(index: int) -> str:
    return f"rows-{index:05d}.bin"


class _ShardWriter:
    """Bytes written in order into an entry's rows files, a new one each `shard_bytes` (0: one
    file). A local file is written under a temporary name and renamed into place by `commit`."""

    def __init__(self, cache: CorpusCache, key: str, shard_bytes: int) -> None:
        self._cache, self._key, self._shard_bytes = cache, key, shard_bytes
        self._stream: Any = None
        self._left = 0
        self._written: list[tuple[str, str]] = []  # (path written, final path)

    def _next(self) -> None:
        self.close()
        final = self._cache._path(self._key, rows_file(len(self._written)))
        target = f"{final}.{os.getpid()}.partial" if self._cache.is_local else final
        self._stream = self._cache._filesystem.open_output_stream(target)
        self._written.append((target, final))
        self._left = self._shard_bytes or -1

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view) or self._stream is None:
            if self._stream is None or self._left == 0:
                self._next()
            take = len(view) if self._left < 0 else min(len(view), self._left)
            self._stream.write(view[:take])
            view = view[take:]
            if self._left > 0:
                self._left -= take

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def commit(self) -> None:
        if self._stream is None and not self._written:
            self.write(b"")  # no rows: one empty file
        self.close()
        for target, final in self._written:
            if target != final:
                os.replace(target, final)

    def discard(self) -> None:
        """A local entry's partial files go; an S3 upload cut short leaves no meta.json, so no entry."""
        if self._cache.is_local:
            if self._stream is not None:
                self._stream.close()
            for target, _ in self._written:
                Path(target).unlink(missing_ok=True)


def cache_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def cache_root(config: TrainConfig) -> str:
    return config.corpus_cache or f"{config.storage_path.rstrip('/')}/{CACHE_FOLDER}"


@dataclass(frozen=True)
class CachedCorpus:
    """A complete cache entry: what a worker needs to map its rows (plain values, for Ray)."""

    root: str
    key: str
    rows: int
    seq_len: int
    fingerprint: str
    shard_bytes: int = 0  # the rows file's size limit: 0, none (one file)
    packing: PackingStats = field(default_factory=PackingStats)

    @property
    def shard_sizes(self) -> list[int]:
        """The size of each file the rows are stored in."""
        if not self.shard_bytes or self.nbytes <= self.shard_bytes:
            return [self.nbytes]
        full, rest = divmod(self.nbytes, self.shard_bytes)
        return [self.shard_bytes] * full + ([rest] if rest else [])

    @property
    def location(self) -> str:
        return f"{self.root.rstrip('/')}/{self.key}"

    @property
    def nbytes(self) -> int:
        return self.rows * (self.seq_len + 1) * FILE_DTYPE.itemsize


class CorpusCache:
    """The cache root: a local folder or a URI pyarrow reaches (s3://)."""

    def __init__(self, root: str) -> None:
        self.root = root
        if is_uri(root):
            self._filesystem, self._base = pyarrow_fs.FileSystem.from_uri(root)
        else:
            self._filesystem, self._base = pyarrow_fs.LocalFileSystem(), os.path.abspath(root)

    @property
    def is_local(self) -> bool:
        return not is_uri(self.root)

    def _path(self, key: str, name: str) -> str:
        return f"{self._base.rstrip('/')}/{key}/{name}"

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """One builder at a time on a local root (the ranks of a torchrun run); a URI's writer is
        the one Ray driver."""
        if not self.is_local:
            yield
            return
        os.makedirs(self._base, exist_ok=True)
        with open(os.path.join(self._base, f"{key}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def lookup(self, key: str) -> CachedCorpus | None:
        """The complete entry under `key`, or None: no meta.json, or a rows file of another size."""
        meta_path = self._path(key, META_FILE)
        if not self._filesystem.get_file_info(meta_path).is_file:
            return None
        with self._filesystem.open_input_stream(meta_path) as stream:
            meta = json.loads(stream.read())
        entry = CachedCorpus(
            self.root,
            key,
            meta["rows"],
            meta["seq_len"],
            meta["fingerprint"],
            meta["shard_bytes"],
            PackingStats(**meta["packing"]),
        )
        paths = [self._path(key, rows_file(index)) for index in range(len(entry.shard_sizes))]
        infos = self._filesystem.get_file_info(paths)
        whole = all(
            info.is_file and info.size == size for info, size in zip(infos, entry.shard_sizes, strict=True)
        )
        return entry if whole else None

    def build(self, key: str, inputs: dict[str, Any], pack: Callable[[RowPacker], None]) -> CachedCorpus:
        """Write the rows `pack` feeds to a packer, then meta.json, which makes the entry complete.
        A local rows file is renamed into place when whole; an S3 object appears only when its
        upload completes."""
        self._filesystem.create_dir(f"{self._base.rstrip('/')}/{key}", recursive=True)
        shard_bytes = 0 if self.is_local else URI_SHARD_BYTES
        writer = _ShardWriter(self, key, shard_bytes)
        try:
            packer = RowPacker(writer.write, inputs["seq_len"])
            pack(packer)
            fingerprint = packer.finish()
            writer.commit()
        except BaseException:
            writer.discard()
            raise
        entry = CachedCorpus(
            self.root, key, packer.rows, inputs["seq_len"], fingerprint, shard_bytes, packer.stats
        )
        meta = {**asdict(entry), "inputs": inputs}
        del meta["root"]
        meta_path = self._path(key, META_FILE)
        meta_target = f"{meta_path}.{os.getpid()}.partial" if self.is_local else meta_path
        with self._filesystem.open_output_stream(meta_target) as stream:
            stream.write(json.dumps(meta, indent=1).encode())
        if self.is_local:
            os.replace(meta_target, meta_path)
        return entry

    def copy_rows_to(self, entry: CachedCorpus, target: Path) -> None:
        """The entry's rows files, joined into one local file."""
        with open(target, "wb") as out:
            for index in range(len(entry.shard_sizes)):
                with self._filesystem.open_input_stream(self._path(entry.key, rows_file(index))) as source:
                    while chunk := source.read(COPY_CHUNK_BYTES):
                        out.write(chunk)

    def rows_path(self, key: str) -> Path:
        """A local root's one rows file."""
        return Path(self._path(key, rows_file(0)))


def cached_rows(
    config: TrainConfig, sources: list[SourceFile], pack: Callable[[RowPacker], None]
) -> tuple[CachedCorpus, bool]:
    """The cache entry of these corpus files under the run's settings, and whether it was there
    already; built by `pack` (which feeds the packer every document's tokens in corpus order)
    when it was not."""
    cache = CorpusCache(cache_root(config))
    inputs = cache_inputs(config, sources)
    key = cache_key(inputs)
    with cache.locked(key):
        found = cache.lookup(key)
        return (found, True) if found else (cache.build(key, inputs, pack), False)


def _map(path: Path, entry: CachedCorpus) -> np.ndarray:
    if entry.rows == 0:  # an empty file cannot be mapped; too few rows is the caller's error
        return np.empty((0, entry.seq_len + 1), dtype=ROW_DTYPE)
    return np.memmap(path, dtype=FILE_DTYPE, mode="r", shape=(entry.rows, entry.seq_len + 1))


def open_rows(entry: CachedCorpus, node_copies: Path = NODE_COPIES) -> np.ndarray:
    """The entry's rows, mapped read-only: indexing reads only the rows it takes. A local root is
    mapped in place; a URI's rows file is first copied to `node_copies` once per node."""
    cache = CorpusCache(entry.root)
    if cache.is_local:
        path = cache.rows_path(entry.key)
        if not path.is_file() or path.stat().st_size != entry.nbytes:
            raise UsageError(
                f"--corpus-cache {entry.root}: the cached rows are not on this node ({path}); workers "
                "on other nodes need a shared root: give an s3:// --storage-path or --corpus-cache"
            )
        return _map(path, entry)
    node_copies.mkdir(parents=True, exist_ok=True)
    path = node_copies / f"{entry.key}.bin"
    with open(node_copies / f"{entry.key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file() or path.stat().st_size != entry.nbytes:
            partial = path.with_suffix(f".{os.getpid()}.partial")
            cache.copy_rows_to(entry, partial)
            os.replace(partial, path)
    return _map(path, entry)


def cached_corpus_rows(entry: CachedCorpus) -> PackedCorpus:
    """A cache entry's rows, mapped (`open_rows`), with its fingerprint and packing counts."""
    return PackedCorpus(open_rows(entry), entry.fingerprint, entry.packing)


def in_process_corpus(config: TrainConfig, data: str | None = None, flag: str = "--data") -> PackedCorpus:
    """The packed rows of a local corpus (`flag`'s value `data`, by default --data), from the cache
    or read and tokenized in this process (the torchrun launcher and the benchmark; under Ray, Ray
    Data reads it). The ranks of one run share the local root: one packs while the others wait."""
    return cached_corpus_rows(_in_process_entry(config, config.data if data is None else data, flag))


def in_process_rows(config: TrainConfig, data: str, flag: str = "--data") -> np.ndarray:
    """`in_process_corpus`'s rows alone."""
    return in_process_corpus(config, data, flag).rows


def _in_process_entry(config: TrainConfig, data: str, flag: str) -> CachedCorpus:
    sources = local_sources(corpus_files(data, flag=flag))

    def pack(packer: RowPacker) -> None:
        documents = (doc for source in sources for doc in read_documents(source.path, config.text_column))
        for tokens in tokenize(documents, config.tokenizer, config.packing_attention):
            packer.add(tokens)

    return cached_rows(config, sources, pack)[0]
