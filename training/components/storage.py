"""Where checkpoints live: a local folder or an object store URI (`s3://bucket/prefix`), written and
read by `torch.distributed.checkpoint` straight there, each rank its own shards.

A location is a string: a local path, or a URI that `pyarrow.fs.FileSystem.from_uri` opens, which is
how Ray Train opens the run's storage too (ray 2.58: ray/train/v2/_internal/execution/storage.py,
`get_fs_and_path`), the same credentials and endpoint (`AWS_ENDPOINT_URL`) included. A local folder
goes through DCP's own `FileSystemWriter` and `FileSystemReader`; a URI through them over pyarrow's
filesystem (`ArrowFileSystem`), so nothing is staged on the node's disk and copied again, and a
restart reads only the byte ranges of its own shards (DCP's reader opens the files its plan names
and seeks to each item).

Every object written is closed explicitly inside the write, so a failed upload raises there: a
pyarrow output stream that is only destroyed logs its error and drops it ("Error ignored when
destroying file"), which is how a checkpoint without its shards once became the latest.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from training.config.run_config import is_uri

# DCP's file of the checkpoint's metadata, written by the coordinator last (torch 2.13:
# torch/distributed/checkpoint/filesystem.py, `_metadata_fn`).
METADATA_FILE = ".metadata"


def resolve(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of `location` and the path in it."""
    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(location)


def location_of(filesystem: pafs.FileSystem, path: str) -> str:
    """The location string of `path` in `filesystem` (the inverse of `resolve`)."""
    scheme = filesystem.type_name
    return path if scheme == "local" else f"{scheme}://{path}"


def join(location: str, *names: str) -> str:
    return posixpath.join(location, *names) if is_uri(location) else os.path.join(location, *names)


# How a rank reads a stored checkpoint. DCP's reader and `torch.load` read each item in many small
# pieces, and each read of a remote file is a request (a ranged GET on S3: the first restart against
# the S3 server made 4,458 of them for a 5 MB checkpoint). So the byte ranges a rank's load plan
# names are fetched whole, neighbours merged (a gap of at most `MERGE_GAP_BYTES`, a range of at most
# `MAX_RANGE_BYTES`): a rank reads its own shards in few large requests and another rank's items
# (the replicated ones DCP stores once) alone, never a whole file it needs a little of.
MERGE_GAP_BYTES = 1 << 20
MAX_RANGE_BYTES = 64 << 20
# A read outside every planned range (the metadata file) fetches at least this much.
UNPLANNED_READ_BYTES = 1 << 20
RANGES_KEPT = 4  # fetched ranges a stream keeps, as the plan's order need not be the file's


def merged_ranges(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) ranges covering the items (offset, length), neighbours merged, sorted."""
    ranges: list[tuple[int, int]] = []
    for offset, length in sorted(items):
        end = offset + length
        if ranges and offset - ranges[-1][1] <= MERGE_GAP_BYTES and end - ranges[-1][0] <= MAX_RANGE_BYTES:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], end))
        else:
            ranges.append((offset, end))
    return ranges


class _RangedFile(io.RawIOBase):
    """A remote file read by whole ranges: a read fetches the planned range that holds it (or, outside
    them, `UNPLANNED_READ_BYTES` from where it starts) in one request and serves the rest from it."""

    def __init__(self, file: Any, ranges: list[tuple[int, int]]) -> None:
        super().__init__()
        self.file, self.size, self.ranges = file, file.size(), ranges
        self.pos = 0
        self.fetched: dict[int, bytes] = {}  # start -> bytes, the last `RANGES_KEPT` fetched

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _block(self, wanted: int) -> tuple[int, bytes]:
        for start, data in self.fetched.items():
            if start <= self.pos < start + len(data):
                return start, data
        index = bisect.bisect_right(self.ranges, (self.pos, self.size + 1)) - 1
        if index >= 0 and self.ranges[index][0] <= self.pos < self.ranges[index][1]:
            start, end = self.ranges[index]
        else:
            start, end = self.pos, self.pos + max(wanted, UNPLANNED_READ_BYTES)
        data = self.file.read_at(min(end, self.size) - start, start)
        self.fetched[start] = data
        if len(self.fetched) > RANGES_KEPT:
            del self.fetched[next(iter(self.fetched))]
        return start, data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self.size - self.pos))
        done = 0
        while done < wanted:
            start, data = self._block(wanted - done)
            offset = self.pos - start
            take = min(wanted - done, len(data) - offset)
            view[done : done + take] = data[offset : offset + take]
            done, self.pos = done + take, self.pos + take
        return done

    def close(self) -> None:
        self.file.close()
        super().close()


class ArrowFileSystem(FileSystemBase):
    """DCP's filesystem interface over a pyarrow filesystem; each stream is closed on leaving."""

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.fs = filesystem
        self.planned: dict[str, list[tuple[int, int]]] = {}  # path -> the ranges a load reads of it

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        name = str(path)
        if "w" in mode:
            stream = self.fs.open_output_stream(name)
        else:
            stream = _RangedFile(self.fs.open_input_file(name), self.planned.get(name, []))
        try:
            yield stream
        except BaseException:
            # A write that failed midway: abandon it without completing the upload.
            with contextlib.suppress(Exception):
                stream.close()
            raise
        if not stream.closed:
            stream.close()  # raises the upload's error, if any

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return posixpath.join(str(path), suffix)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        self.fs.move(str(path), str(new_path))

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    def mkdir(self, path: str | os.PathLike) -> None:
        self.fs.create_dir(str(path), recursive=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return is_uri(str(checkpoint_id))

    def exists(self, path: str | os.PathLike) -> bool:
        return bool(self.fs.get_file_info(str(path)).type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike) -> None:
        self.fs.delete_file(str(path))


class _ArrowWriter(FileSystemWriter):
    """DCP's writer into an object store. No fsync (an object is durable once its upload completes);
    one thread per rank, as the local writer uses."""

    def __init__(self, location: str) -> None:
        filesystem, path = resolve(location)
        super().__init__(path, sync_files=False)
        self.fs = ArrowFileSystem(filesystem)  # type: ignore[assignment]  # DCP's fsspec writer does the same
        self.path = path


class _ArrowReader(FileSystemReader):
    """DCP's reader from an object store: before DCP reads the plan's items, each file's ranges are
    planned (`merged_ranges`), so its streams fetch them whole."""

    def __init__(self, location: str) -> None:
        filesystem, path = resolve(location)
        super().__init__(path)
        self.arrow = ArrowFileSystem(filesystem)
        self.fs = self.arrow  # type: ignore[assignment]  # DCP's fsspec reader does the same
        self.path = path

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        items: dict[str, list[tuple[int, int]]] = {}
        for item in plan.items:
            stored = self.storage_data[item.storage_index]
            items.setdefault(posixpath.join(self.path, stored.relative_path), []).append(
                (stored.offset, stored.length)
            )
        self.arrow.planned = {name: merged_ranges(found) for name, found in items.items()}
        return super().read_data(plan, planner)


def storage_writer(location: str) -> FileSystemWriter:
    """DCP's writer of a checkpoint at `location`; a local folder's syncs its files, as DCP's does."""
    return _ArrowWriter(location) if is_uri(location) else FileSystemWriter(location)


def storage_reader(location: str) -> FileSystemReader:
    return _ArrowReader(location) if is_uri(location) else FileSystemReader(location)


def read_json(location: str) -> Any:
    filesystem, path = resolve(location)
    with filesystem.open_input_stream(path) as stream:
        return json.loads(stream.read().decode())


def write_json(location: str, value: Any) -> None:
    """Written whole or not at all: closed here, so an upload's error raises here."""
    filesystem, path = resolve(location)
    stream = filesystem.open_output_stream(path)
    stream.write(json.dumps(value).encode())
    stream.close()


def exists(location: str) -> bool:
    filesystem, path = resolve(location)
    return bool(filesystem.get_file_info(path).type == pafs.FileType.File)


def upload_folder(local: str, location: str) -> None:
    """A local folder's files copied under `location`, each closed explicitly (its error raised)."""
    filesystem, path = resolve(location)
    for folder, _, files in os.walk(local):
        for name in files:
            source = os.path.join(folder, name)
            target = posixpath.join(path, os.path.relpath(source, local).replace(os.sep, "/"))
            stream = filesystem.open_output_stream(target)
            with open(source, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    stream.write(chunk)
            stream.close()


def remove(location: str) -> None:
    """A checkpoint folder and everything in it; nothing when it is already gone."""
    filesystem, path = resolve(location)
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_dir(path)


def folders(location: str, prefix: str) -> list[str]:
    """The names of the folders directly under `location` whose name starts with `prefix`, sorted."""
    filesystem, path = resolve(location)
    if filesystem.get_file_info(path).type != pafs.FileType.Directory:
        return []
    listed = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(
        info.base_name
        for info in listed
        if info.type == pafs.FileType.Directory and info.base_name.startswith(prefix)
    )


def missing_files(location: str) -> list[str]:
    """What keeps the DCP checkpoint at `location` from being whole: its metadata missing, or each
    file the metadata names that is missing or shorter than the items it holds (`name: why`). []: every
    shard is there at its size."""
    filesystem, path = resolve(location)
    try:
        metadata = storage_reader(location).read_metadata()
    except (FileNotFoundError, OSError) as error:
        return [f"{METADATA_FILE}: {' '.join(str(error).split())[:200]}"]
    needed = shard_sizes(metadata)
    found = filesystem.get_file_info([posixpath.join(path, name) for name in needed])
    problems = []
    for info, (name, size) in zip(found, needed.items(), strict=True):
        if info.type != pafs.FileType.File:
            problems.append(f"{name}: missing")
        elif info.size < size:
            problems.append(f"{name}: {info.size} of {size} bytes")
    return problems


def shard_sizes(metadata: Metadata) -> dict[str, int]:
    """Each file the metadata names, with the least size that holds every item stored in it."""
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return dict(sorted(sizes.items()))
