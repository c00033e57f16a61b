"""`python -m training.fabric_probe`: nccl-tests' bandwidth formulas (NVIDIA/nccl-tests,
doc/PERFORMANCE.md) on hand-computed numbers, its flags, and real 2-process runs on gloo under an
embedded Ray and under torchrun that print one JSON line of positive figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from tests.harness.paths import REPO_ROOT
from training import fabric_probe
from training.fabric_probe import (
    algorithm_bandwidth_gbps,
    bus_bandwidth,
    message_bytes,
    parse_args,
)

TIMEOUT_S = 300
GIB = 1024**3
SIZES = (64 * 1024, 256 * 1024, 1024 * 1024)
ROW_KEYS = {"collective", "bytes", "algbw_gbps", "busbw_gbps"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def run_probe(*args: str, launcher: list[str] | None = None, env: dict[str, str] | None = None):
    environment = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RANK")}
    environment.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run(
        [*(launcher or [sys.executable]), "-m", "training.fabric_probe", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment,
    )


# --- formulas -------------------------------------------------------------------------------


def test_algorithm_bandwidth_is_bits_over_time():
    # 1 GiB = 8 * 1073741824 bits = 8.589934592 Gbit, in 0.5 s.
    assert algorithm_bandwidth_gbps(GIB, 0.5) == pytest.approx(17.179869184)
    # 1 MB in 1 ms: 8e6 bits / 1e-3 s = 8 Gbit/s, nccl-tests' 1 GB/s.
    assert algorithm_bandwidth_gbps(1_000_000, 1e-3) == pytest.approx(8.0)


@pytest.mark.parametrize(
    ("collective", "algbw", "world_size", "busbw"),
    [
        ("all_reduce", 10.0, 2, 10.0),  # 2 * 1 / 2
        ("all_reduce", 10.0, 8, 17.5),  # 2 * 7 / 8
        ("all_reduce", 12.0, 4, 18.0),  # 2 * 3 / 4
        ("all_gather", 12.0, 4, 9.0),  # 3 / 4
        ("all_gather", 16.0, 16, 15.0),  # 15 / 16
        ("reduce_scatter", 10.0, 2, 5.0),  # 1 / 2
        ("reduce_scatter", 8.0, 8, 7.0),  # 7 / 8
        ("all_reduce", 10.0, 1, 0.0),  # one rank: nothing crosses a link
        ("all_gather", 10.0, 1, 0.0),
    ],
)
def test_bus_bandwidth_applies_nccl_tests_factor(collective, algbw, world_size, busbw):
    assert bus_bandwidth(collective, algbw, world_size) == pytest.approx(busbw)


@pytest.mark.parametrize(
    ("requested", "world_size", "size"),
    [
        (GIB, 2, GIB),
        (GIB, 3, 1_073_741_820),  # 89,478,485 float32 per rank
        (1000, 8, 992),  # 31 float32 per rank
        (1, 4, 16),  # at least one float32 per rank
    ],
)
def test_message_size_splits_into_whole_float32_per_rank(requested, world_size, size):
    assert message_bytes(requested, world_size) == size


# --- flags ----------------------------------------------------------------------------------


def test_sizes_take_binary_units():
    settings = parse_args(["--local", "--sizes", "64K,1m,1G,100"])
    assert settings.sizes == (65536, 1048576, GIB, 100)


@pytest.mark.parametrize("text", ["1T", "0", "", "1M,,4M", "-1", "1.5M"])
def test_a_bad_size_list_names_the_flag(text, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--sizes", text])
    assert "argument --sizes: expected sizes in bytes > 0" in capsys.readouterr().err


def test_help_names_each_devices_default_sizes():
    text = fabric_probe.build_parser().format_help()
    assert "1M,16M,256M,1G on CUDA" in text and "64K,256K,1M on CPU" in text


@pytest.mark.parametrize(
    ("argv", "cuda", "use_gpu"),
    [
        (["--local"], False, False),
        (["--local"], True, True),
        (["--launcher", "torchrun"], False, False),
        ([], False, True),  # a cluster is for its GPUs
        (["--local", "--no-gpu"], True, False),
        (["--local", "--gpu"], False, True),
    ],
)
def test_gpus_by_default_where_the_workers_have_them(argv, cuda, use_gpu, monkeypatch):
    monkeypatch.setattr(fabric_probe.torch.cuda, "is_available", lambda: cuda)
    assert parse_args(argv).use_gpu is use_gpu


def test_local_does_not_combine_with_torchrun(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--local", "--launcher", "torchrun"])
    assert "--local starts an embedded Ray" in capsys.readouterr().err


def test_torch_2_11_collective_names_stand_in_for_2_13s(monkeypatch):
    """The GPU benchmark machine's torch 2.11 lacks the names torch 2.13 introduced."""
    assert fabric_probe._gather_and_scatter() == (dist.all_gather_single, dist.reduce_scatter_single)
    monkeypatch.delattr(dist, "all_gather_single")
    monkeypatch.delattr(dist, "reduce_scatter_single")
    assert fabric_probe._gather_and_scatter() == (dist.all_gather_into_tensor, dist.reduce_scatter_tensor)


# --- runs -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_torchrun_without_torchrun_is_one_line():
    result = run_probe("--launcher", "torchrun")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "python -m training.fabric_probe: error: --launcher torchrun needs torchrun: "
        "torchrun --nproc-per-node=N -m training.fabric_probe ..."
    ]


@pytest.mark.slow
def test_without_local_or_ray_address_is_one_line():
    result = run_probe("--no-gpu", "--workers", "2")
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "python -m training.fabric_probe: error: no Ray cluster given"
    )


def assert_report(stdout: str) -> None:
    """One JSON line: every collective at every size, positive rates, busbw from algbw."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    report = json.loads(lines[0])
    assert set(report) == {"world_size", "iters", "warmup_iters", "results"} and report["world_size"] == 2
    rows = report["results"]
    assert all(set(row) == ROW_KEYS for row in rows)
    assert [(row["collective"], row["bytes"]) for row in rows] == [
        (collective, size) for collective in ("all_reduce", "all_gather", "reduce_scatter") for size in SIZES
    ]
    for row in rows:
        assert row["algbw_gbps"] > 0 and row["busbw_gbps"] > 0, row
        assert row["busbw_gbps"] == pytest.approx(bus_bandwidth(row["collective"], row["algbw_gbps"], 2))


@pytest.mark.slow
def test_a_ray_worker_group_on_gloo_reports_every_collective(ray_head):
    """Joined through RAY_ADDRESS, as the probe's job joins the RayCluster's head."""
    result = run_probe(
        "--no-gpu", "--workers", "2", "--sizes", "64K,256K,1M", "--iters", "5",
        env={"RAY_ADDRESS": ray_head.address},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert_report(result.stdout)


@pytest.mark.slow
def test_two_torchrun_ranks_on_gloo_report_every_collective():
    result = run_probe("--launcher", "torchrun", "--iters", "5", launcher=TORCHRUN)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_report(result.stdout)  # the CPU default sizes
