"""The profile's pure readings: the profiler's idle gaps, on a trace in the format torch.profiler
exports.

torch.profiler's `export_chrome_trace` writes Chrome Trace Event Format "complete" events
(`"ph": "X"`, microsecond `ts` and `dur`); GPU work has the categories `kernel`,
`gpu_memcpy` and `gpu_memset`, one per stream, and `with_stack=True` adds the host's Python
frames as `python_function` events. The trace below is written the same way.
"""

from __future__ import annotations

import json

import pytest

from bench.profile_step import idle_gaps


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
