"""The benchmark's pure readings: the profiler's idle gaps, on a trace in the format
torch.profiler exports; the document rows and attention shares; the parity report of two runs.

torch.profiler's `export_chrome_trace` writes Chrome Trace Event Format "complete" events
(`"ph": "X"`, microsecond `ts` and `dur`); GPU work has the categories `kernel`,
`gpu_memcpy` and `gpu_memset`, one per stream, and `with_stack=True` adds the host's Python
frames as `python_function` events. The trace below is written the same way.
"""

from __future__ import annotations

import json

import pytest

from bench.profile_step import idle_gaps
from bench.train_bench import attention_shares, documents_rows
from training.model.causal_lm import model_batch


def _event(category: str, name: str, start: float, duration: float) -> dict:
    return {"ph": "X", "cat": category, "name": name, "ts": start, "dur": duration, "pid": 0, "tid": 0}


def test_idle_time_counts_only_moments_when_no_stream_is_busy(tmp_path):
    events = [
        _event("kernel", "gemm_a", 0, 100),
        # A copy on another stream overlapping the GEMM: no gap between them.
        _event("gpu_memcpy", "Memcpy DtoD", 90, 30),
        # 80 us idle (120 -> 200) while the host is in the optimizer.
        _event("kernel", "adamw", 200, 50),
        # 500 us idle (250 -> 750) while the host reads the loss.
        _event("gpu_memset", "Memset", 750, 10),
        _event("kernel", "gemm_b", 755, 45),
        _event("python_function", "training/loop.py(120): train", 0, 1000),
        _event("python_function", "torch/optim/adamw.py(200): step", 110, 95),
        _event("python_function", "training/metrics/run_metrics.py(30): mean_across_ranks", 240, 520),
        _event("cpu_op", "aten::item", 260, 480),
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))

    gaps = idle_gaps(str(trace), steps=2)

    assert gaps["gpu_idle_ms_per_step"] == pytest.approx((80 + 500) / 1e3 / 2)
    assert gaps["gaps_over_100us_per_step"] == 0.5
    largest, second = gaps["largest_gaps"]
    assert largest["ms"] == pytest.approx(0.5)
    assert (largest["after_kernel"], largest["before_kernel"]) == ("adamw", "Memset")
    assert largest["host_in"] == [
        "training/loop.py(120): train",
        "training/metrics/run_metrics.py(30): mean_across_ranks",
    ]
    assert second["after_kernel"] == "Memcpy DtoD"
    assert second["host_in"][-1] == "torch/optim/adamw.py(200): step"


def test_the_isolated_variants_rows_hold_the_documents_their_mfu_counts():
    """The benchmark's rows of 8 documents a row are what the loop isolates (model_batch), and their
    attention shares are those of 8 causal documents of 512 tokens: 80 of the 1,024 flex blocks."""
    import torch

    rows = documents_rows(3, 4096, 8, vocab_size=1000)
    batch = model_batch(rows, torch.device("cpu"))
    assert batch.document_ids is not None
    assert batch.document_ids[:, -1].tolist() == [7, 7, 7]
    assert (batch.position_ids == 0).sum(dim=1).tolist() == [8, 8, 8]
    shares = attention_shares({"seq_len": 4096, "documents": 8, "attention": "flex"})
    assert shares == {"attended": 8 * 512 * 513 / 2 / 4096**2, "blocks": 80 / 1024}
    assert attention_shares({"seq_len": 4096}) == {"attended": 4097 / 2 / 4096}


def test_a_parity_report_says_how_far_the_candidate_curve_lies_from_the_baseline():
    from bench.train_bench import parity_report

    curves = {"sdpa": [4.0, 3.0, 2.0, 1.0, 1.0], "flex": [4.0, 3.5, 2.0, 1.0, 1.5]}
    report = parity_report("flex-parity", {"seq": 8}, 5, curves, {}, "sdpa", "flex")
    assert (report["name"], report["seq"], report["steps"]) == ("flex-parity", 8, 5)
    assert report["loss_first"] == {"sdpa": 4.0, "flex": 4.0}
    assert report["loss_last"] == {"sdpa": 1.0, "flex": 1.5}
    assert report["mean_loss_last_1_steps"] == {"sdpa": 1.0, "flex": 1.5}  # the last fifth: 1 step
    assert report["relative_difference_last_steps"] == 0.5
    assert report["mean_difference"] == 0.2 and report["max_abs_difference"] == 0.5
