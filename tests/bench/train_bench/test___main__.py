"""`python -m bench.train_bench` on the CPU with the tiny architecture: the report it writes, a
variant that breaks or runs out of memory recorded rather than fatal, and the memory cases' rows.
The loops themselves are tests/bench/train_bench/test_loops.py's; here they are stand-ins."""

from __future__ import annotations

import json
import sys

import torch

import bench.train_bench.__main__ as command

SUMMARY = {
    "step_time_s": 0.5,
    "tokens_per_s": 100.0,
    "mfu": None,
    "peak_mem_gib": None,
    "loss_first": 4.0,
    "loss_last": 3.0,
}


def run(monkeypatch, tmp_path, *flags: str) -> dict:
    out = tmp_path / "run.json"
    argv = ["python -m bench.train_bench", "--out", str(out), "--device", "cpu", "--model-config", "tiny"]
    monkeypatch.setattr(sys, "argv", [*argv, "--skip-reference", "--naive", *flags])
    command.main()
    return json.loads(out.read_text())


def test_each_variant_is_a_row_and_one_that_breaks_or_runs_out_of_memory_is_recorded(
    monkeypatch, tmp_path, capsys
):
    def tuned_loop(config, device, spec):
        if config.batch_size == 8:
            raise RuntimeError("a broken kernel")
        if config.batch_size == 6:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return {**SUMMARY, "steps": config.steps}

    monkeypatch.setattr(command, "tuned_loop", tuned_loop)
    variants = ["tuned-eager-4096x4", "tuned-compiled-4096x8", "tuned-compiled-4096x6"]
    report = run(monkeypatch, tmp_path, "--memory-cases", "--steps", "3", "--variants", *variants)
    assert report["model_config"] == "tiny" and report["gpu_name"] is None
    assert report["loss_check"] is not None
    printed = capsys.readouterr().out
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    ran, broke, oom = lines[1:]  # after the loss check's line, one a variant
    assert (ran["name"], ran["steps"], ran["tokens_per_s"], ran["loss_last"]) == (variants[0], 3, 100.0, 3.0)
    assert broke["name"] == variants[1] and "a broken kernel" in broke["error"]
    assert oom == {"name": variants[2], **command.TUNED_VARIANTS[variants[2]], "oom": True}
    # The file holds each variant saved as it ended, the failed last one too.
    assert report["variants"] == [ran, broke, oom]
    assert "out of memory" in printed and "RuntimeError('a broken kernel')" in printed  # the table


def test_a_memory_case_reports_its_mesh_and_whether_it_fits_an_l4(monkeypatch, tmp_path):
    def memory_at_world_size(config, world_size, local_world_size, device):
        assert (world_size, local_world_size) == (8, 4 if config.hsdp_replicas == 0 else 8)
        replicas = 2 if config.hsdp_replicas == 0 else 1
        peak = 30.0 if config.batch_size == 2 else 10.0
        return {
            "hsdp_replicas": replicas,
            "peak_mem_gib": peak,
            "step_time_s": 1.0,
            "tokens_per_s_per_gpu": 9.0,
        }

    monkeypatch.setattr(command, "memory_at_world_size", memory_at_world_size)
    cases = ["seq4096x1-ac-hsdp-2x4", "seq4096x2-ac-fsdp-8"]
    report = run(monkeypatch, tmp_path, "--variants", "--memory-cases", *cases)
    assert report["variants"] == []
    hsdp, fsdp = report["memory_at_world_size_8"]
    assert (hsdp["name"], hsdp["mesh"], hsdp["batch_size"], hsdp["fits_l4_budget"]) == (
        cases[0],
        "hsdp-2x4",
        1,
        True,
    )
    assert (fsdp["name"], fsdp["mesh"], fsdp["batch_size"], fsdp["fits_l4_budget"]) == (
        cases[1],
        "fsdp-8",
        2,
        False,
    )
