"""How the driver's memory grows with the corpus: packing (`pack_documents`) measured on the CPU.

Under Ray the driver receives every document's tokens from Ray Data, packs them into one array
and puts it in the head's object store. Each size runs in a fresh process, which reports its
peak resident memory before and after packing documents of `--document-tokens` tokens, so the
difference is what packing holds at its peak: the documents' pieces and the packed stream.

    python -m bench.corpus_memory --out bench/results/cpu-corpus-memory.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shlex
import subprocess
import sys
from typing import Any

import numpy as np

from training.data import ROW_DTYPE, pack_documents

MIB = 2**20


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(tokens: int, document_tokens: int, seq_len: int) -> dict[str, Any]:
    """Pack `tokens` tokens in this process; the peak memory packing added."""
    documents = tokens // document_tokens
    piece = np.arange(document_tokens, dtype=ROW_DTYPE)
    before = peak_rss()
    rows = pack_documents((piece.copy() for _ in range(documents)), seq_len)
    added = peak_rss() - before
    return {
        "tokens": documents * document_tokens,
        "documents": documents,
        "rows_mib": round(rows.nbytes / MIB, 1),
        "peak_added_mib": round(added / MIB, 1),
        "bytes_per_token": round(added / (documents * document_tokens), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25e6,50e6,100e6,200e6", help="corpus sizes in tokens")
    parser.add_argument("--document-tokens", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a child's single size
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(int(args.one), args.document_tokens, args.seq_len)))
        return
    results = []
    for size in args.sizes.split(","):
        child = [sys.executable, "-m", "bench.corpus_memory", "--one", size]
        child += ["--document-tokens", str(args.document_tokens), "--seq-len", str(args.seq_len)]
        result = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
        print(json.dumps(result), flush=True)
        results.append(result)
    report = {
        "what": __doc__.splitlines()[0],
        "command": shlex.join(["python", "-m", "bench.corpus_memory", *sys.argv[1:]]),
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "versions": {"numpy": np.__version__, "python": platform.python_version()},
        "document_tokens": args.document_tokens,
        "seq_len": args.seq_len,
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
