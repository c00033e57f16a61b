"""How the driver's and a worker's memory grow with the corpus, measured on the CPU.

`in-memory` is the packing of before the corpus cache (`pack_documents`): the driver held every
document's tokens and the packed array, then put the array in the head's object store. `streamed`
is the packing of now: `RowPacker` writes full rows into a corpus cache entry on disk as the
documents arrive (`CorpusCache.build`, a local root). `worker` maps that entry (`open_rows`) and
draws `--worker-batches` batches of 8 rows (`epoch_batches`), as a rank does. `ray-in-memory` and
`ray-streamed` are the Ray driver end to end on a JSONL corpus of the byte tokenizer, Ray Data
reading and tokenizing it on an embedded Ray of 2 CPUs: the old packing of Ray Data's batches, and
`cached_corpus` (training/launch/ray_corpus.py), which streams them into the cache.

Each (size, path) runs in a fresh process, which reports the peak resident memory the work added
(ru_maxrss) and, polled every 10 ms, the peak of each kind: RssAnon (the heap, which the kernel
cannot drop), RssFile (mapped files: a mapped corpus is page cache, shared by a node's workers and
reclaimable) and RssShmem (Ray's object store, which the driver maps zero-copy; Ray's memory guide
counts it apart from a process's heap).

    python -m bench.corpus_memory --streamed-sizes 1e9,2e9 --out bench/reports/corpus-memory_cpu_YYYYMM/cpu-corpus-cache-memory.json
    python -m bench.corpus_memory --sizes '' --streamed-sizes '' --ray-sizes 20e6,100e6,300e6 \\
        --out bench/reports/corpus-memory_cpu_YYYYMM/cpu-corpus-cache-memory-ray.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from training.data.batches import epoch_batches
from training.data.corpus_cache import CorpusCache, open_rows
from training.data.packing import ROW_DTYPE, RowPacker, pack_documents

MIB = 2**20
PATHS = ("in-memory", "streamed", "worker")
RAY_PATHS = ("ray-in-memory", "ray-streamed")
WORKER_BATCH = 8  # rows a rank takes per micro-batch
KINDS = ("RssAnon", "RssFile", "RssShmem")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident() -> dict[str, int]:
    """This process's resident memory by kind (Linux)."""
    kinds = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in KINDS:
            kinds[name] = int(value.split()[0]) * 1024
    return kinds


class PeakSampler:
    """The most of each kind of resident memory, polled every 10 ms on a thread while it runs."""

    def __init__(self) -> None:
        self.start = resident()
        self.peaks = dict(self.start)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._done.wait(0.01):
            for kind, value in resident().items():
                self.peaks[kind] = max(self.peaks[kind], value)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def added_mib(self) -> dict[str, float]:
        return {
            f"{kind}_peak_added_mib": round((self.peaks[kind] - self.start[kind]) / MIB, 1) for kind in KINDS
        }


def _documents(documents: int, document_tokens: int) -> Iterator[np.ndarray]:
    piece = np.arange(document_tokens, dtype=ROW_DTYPE)
    return (piece.copy() for _ in range(documents))


def run_path(
    path: str, documents: int, document_tokens: int, seq_len: int, folder: str, batches: int
) -> dict:
    """One packer path over `documents` documents; what it produced."""
    cache = CorpusCache(folder)
    key = f"bench-{documents * document_tokens}-{seq_len}"
    if path == "in-memory":
        rows = pack_documents(_documents(documents, document_tokens), seq_len)
        return {"rows": len(rows), "rows_mib": round(rows.nbytes / MIB, 1)}
    if path == "streamed":

        def pack(packer: RowPacker) -> None:
            for tokens in _documents(documents, document_tokens):
                packer.add(tokens)

        entry = cache.build(key, {"seq_len": seq_len}, pack)
        return {"rows": entry.rows, "rows_mib": round(entry.nbytes / MIB, 1)}
    found = cache.lookup(key)
    assert found is not None, "run the streamed path of this size first"
    stream = epoch_batches(open_rows(found), seed=0, rank=0, world_size=1, batch_size=WORKER_BATCH)
    for _ in range(batches):
        next(stream)
    return {"rows": found.rows, "rows_mib": round(found.nbytes / MIB, 1), "batches": batches}


def run_ray_path(path: str, tokens: int, seq_len: int, folder: str) -> dict:
    """The Ray driver packing a JSONL corpus Ray Data reads and tokenizes; what it produced."""
    from training.config.run_config import parse_args
    from training.data.documents import batch_tokens
    from training.launch.ray_corpus import cached_corpus, tokenized_documents

    corpus = Path(folder) / f"corpus-{tokens}.jsonl"
    cache = Path(folder) / f"cache-{tokens}-{path}"
    flags = ["--data", str(corpus), "--seq-len", str(seq_len), "--corpus-cache", str(cache)]
    config = dataclasses.replace(parse_args([*flags, "--batch-size", "1"]), local=True)
    if path == "ray-in-memory":  # the driver's packing before the cache, as it was
        batches = tokenized_documents([str(corpus)], config).iter_batches(batch_format="numpy")
        rows = pack_documents((each for batch in batches for each in batch_tokens(batch)), seq_len)
        return {"rows": len(rows), "rows_mib": round(rows.nbytes / MIB, 1)}
    entry = cached_corpus(config, workers=1)
    return {"rows": entry.rows, "rows_mib": round(entry.nbytes / MIB, 1)}


def measure(args: argparse.Namespace, path: str, tokens: int, folder: str) -> dict[str, Any]:
    """Run one path over `tokens` tokens in this process; the peak memory it added."""
    documents = tokens // args.document_tokens
    measured: dict[str, Any] = {}
    if path in RAY_PATHS:
        import ray

        store = {"object_store_memory": args.object_store_mib * MIB} if args.object_store_mib else {}
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, **store)
        measured["object_store_mib"] = round(ray.cluster_resources()["object_store_memory"] / MIB)
        importlib.import_module("training.launch.ray_launcher")  # its imports (ray.data) are no packing
    before, started = peak_rss(), time.perf_counter()
    with PeakSampler() as sampler:
        if path in RAY_PATHS:
            measured.update(run_ray_path(path, tokens, args.seq_len, folder))
        else:
            measured.update(
                run_path(path, documents, args.document_tokens, args.seq_len, folder, args.worker_batches)
            )
    added = peak_rss() - before
    return {
        "path": path,
        "tokens": documents * args.document_tokens,
        "documents": documents,
        **measured,
        "seconds": round(time.perf_counter() - started, 2),
        "peak_added_mib": round(added / MIB, 1),
        "bytes_per_token": round(added / (documents * args.document_tokens), 3),
        **sampler.added_mib(),
    }


def write_jsonl_corpus(path: Path, tokens: int, document_tokens: int) -> None:
    """Documents of `document_tokens` byte-tokenizer tokens (their EOS included)."""
    line = json.dumps({"text": "x" * (document_tokens - 1)}) + "\n"
    with open(path, "w") as out:
        for _ in range(tokens // document_tokens):
            out.write(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25e6,50e6,100e6,200e6", help="corpus sizes in tokens, all paths")
    parser.add_argument("--streamed-sizes", default="1e9", help="larger sizes: streamed and worker only")
    parser.add_argument("--ray-sizes", default="", help="sizes for the Ray driver paths (none by default)")
    parser.add_argument(
        "--ray-paths",
        default=",".join(RAY_PATHS),
        help="which Ray paths (the in-memory one needs 12 B/token)",
    )
    parser.add_argument(
        "--object-store-mib", type=int, default=0, help="the Ray paths' store (0: Ray's default)"
    )
    parser.add_argument("--document-tokens", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--worker-batches", type=int, default=200)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # a child's path, size and folder
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.one:
        path, size, folder = args.one
        print("\n" + json.dumps(measure(args, path, int(float(size)), folder)))  # last: Ray may print first
        return
    runs = [(size, path) for size in filter(None, args.sizes.split(",")) for path in PATHS]
    runs += [(size, path) for size in filter(None, args.streamed_sizes.split(",")) for path in PATHS[1:]]
    ray_sizes = list(filter(None, args.ray_sizes.split(",")))
    runs += [(size, path) for size in ray_sizes for path in args.ray_paths.split(",")]
    passed = ["--document-tokens", str(args.document_tokens), "--seq-len", str(args.seq_len)]
    passed += ["--worker-batches", str(args.worker_batches), "--object-store-mib", str(args.object_store_mib)]
    results = []
    folder = tempfile.mkdtemp(prefix="corpus-memory-")
    try:
        for size in ray_sizes:
            write_jsonl_corpus(
                Path(folder) / f"corpus-{int(float(size))}.jsonl", int(float(size)), args.document_tokens
            )
        for size, path in runs:
            child = [sys.executable, "-m", "bench.corpus_memory", "--one", path, size, folder, *passed]
            done = subprocess.run(child, check=True, capture_output=True, text=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        shutil.rmtree(folder)
    import ray

    report = {
        "what": __doc__.splitlines()[0],
        "command": shlex.join(["python", "-m", "bench.corpus_memory", *sys.argv[1:]]),
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "versions": {"numpy": np.__version__, "ray": ray.__version__, "python": platform.python_version()},
        "document_tokens": args.document_tokens,
        "seq_len": args.seq_len,
        "worker_batch_rows": WORKER_BATCH,
        "baseline": "in-memory and ray-in-memory: the packing before the corpus cache, in the same run",
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
