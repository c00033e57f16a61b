"""What per-document attention (`--document-attention isolated`) costs against causal packing.

One GPU, the job's own model, `model_batch` and `train_step` (FSDP2 over one rank, bf16, eager or
with `--compile` the job's compiled layers):
the same random rows trained as causally packed rows and as rows of `--documents` isolated
documents each, whose positions restart at every document so that transformers builds the
block-diagonal causal mask (SDPA, the job's attention; flex attention, for comparison). The
causal rows run first and again last, so their two measurements bound the drift of the machine.

    python -m bench.document_attention --out bench/reports/flex-attention_HW_YYYYMM/document-attention.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.train_bench.session import (
    BenchSession,
    benchmark_config,
    release_memory,
    start_process_group,
    timed_steps,
)
from training.build import build
from training.config.settings import ATTENTION_KERNELS
from training.data.packing import DOCUMENT_START
from training.model.causal_lm import ModelBatch, model_batch
from training.step import train_step

VARIANTS = ("causal", "isolated-sdpa", "isolated-flex", "causal-again")


def rows(batch_size: int, seq_len: int, documents: int, vocab_size: int, isolated: bool) -> np.ndarray:
    """Random stored rows; isolated ones start a document every seq_len / documents tokens."""
    generator = np.random.default_rng(0)
    stored = generator.integers(0, vocab_size, size=(batch_size, seq_len + 1), dtype=np.int32)
    if isolated:
        stored[:, seq_len // documents : seq_len : seq_len // documents] |= DOCUMENT_START
    return stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", default="qwen2.5-1.5b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--documents", type=int, default=8, help="documents per row")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--compile", action="store_true", help="compile each decoder layer, as the job does")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out")
    args = parser.parse_args()

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    start_process_group("nccl" if device.type == "cuda" else "gloo", 1, device)
    config = benchmark_config(
        args.model_config,
        args.steps,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        compile=args.compile,
        activation_checkpointing=False,
        reshard_after_forward=False,
        hsdp_replicas=1,
        use_gpu=device.type == "cuda",
    )
    model, optimizer, architecture, _ = build(config, BenchSession(1, 1, device))
    tokens = args.batch_size * args.seq_len
    results: list[dict[str, Any]] = []
    for variant in args.variants.split(","):
        stored = rows(
            args.batch_size, args.seq_len, args.documents, architecture.vocab_size, "isolated" in variant
        )
        started = time.perf_counter()
        batch = model_batch(stored, device)
        host_ms = (time.perf_counter() - started) * 1000
        model.causal_lm.set_attn_implementation(
            ATTENTION_KERNELS["flex" if variant.endswith("flex") else "sdpa"]
        )
        record: dict[str, Any] = {"variant": variant, "model_batch_host_ms": round(host_ms, 2)}
        try:
            step_time, losses = timed_steps(stepper(model, optimizer, batch, config.lr), args.steps)
            record.update(
                step_time_s=round(step_time, 4),
                tokens_per_s=round(tokens / step_time),
                loss_first=round(losses[0], 4),
                loss_last=round(losses[-1], 4),
            )
        except Exception as error:  # a variant the stack cannot run is a result, not the end
            record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        print(json.dumps(record), flush=True)
        results.append(record)
        release_memory()
    causal = [r["tokens_per_s"] for r in results if r["variant"].startswith("causal") and "tokens_per_s" in r]
    for record in results:
        if causal and "tokens_per_s" in record:
            record["vs_causal_mean"] = round(record["tokens_per_s"] / (sum(causal) / len(causal)) - 1, 4)
    import transformers

    report = {
        "what": __doc__.splitlines()[0],
        "command": shlex.join(["python", "-m", "bench.document_attention", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "model_config": args.model_config,
        "shape": {
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "documents_per_row": args.documents,
            "compile": args.compile,
        },
        "results": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")


def stepper(model: Any, optimizer: Any, batch: ModelBatch, lr: float) -> Callable[[], torch.Tensor]:
    """One optimizer step of the job's `train_step` per call, its loss as a tensor."""
    numbers = itertools.count(1)
    return lambda: torch.tensor(train_step(model, optimizer, [batch], lr, 1.0, step=next(numbers))[0])


if __name__ == "__main__":
    main()
