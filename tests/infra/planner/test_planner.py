"""The communication planner's model: its numbers hang together and its widths are the job's."""

from __future__ import annotations

import dataclasses

import pytest

from infra.planner import planner, report
from infra.planner.figures import INSTANCES
from training.config.run_config import parse_flags


def test_the_reduce_and_gather_widths_are_the_jobs_mixed_precision():
    torch = pytest.importorskip("torch")
    from training.distributed.parallelize import MIXED_PRECISION

    assert torch.empty((), dtype=MIXED_PRECISION.param_dtype).element_size() == planner.PARAM_BYTES
    assert torch.empty((), dtype=MIXED_PRECISION.reduce_dtype).element_size() == planner.REDUCE_BYTES


CASES = [(instance, preset) for instance in INSTANCES for preset in ("smoke", "throughput")]


def workload(preset: str) -> planner.Workload:
    found = planner.workload_of(parse_flags(["--preset", preset, "--workers", "8"], paths_here=False))
    assert found is not None
    return found


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_hsdp_moves_fewer_inter_node_bytes_than_fsdp(instance, preset):
    cluster = planner.cluster_of(instance, 2, INSTANCES[instance])
    fsdp, hsdp = planner.forecast(workload(preset), cluster)
    assert (fsdp.name, hsdp.name) == ("FSDP", f"HSDP 2x{INSTANCES[instance].gpus}")
    assert 0 < hsdp.inter_node_bytes_per_step < fsdp.inter_node_bytes_per_step


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_a_slower_line_never_predicts_more_tokens(instance, preset):
    rates = [1, 5, 10, 25, 40, 100, 400, 3200]
    for nodes in (2, 4):
        forecasts = [
            planner.forecast(workload(preset), planner.cluster_of(instance, nodes, INSTANCES[instance], rate))
            for rate in rates
        ]
        for strategy in range(2):
            tokens = [rows[strategy].tokens_per_s for rows in forecasts]
            assert tokens == sorted(tokens), tokens


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_every_figure_is_positive(instance, preset):
    for row in report.forecast_rows(
        planner.forecast(workload(preset), planner.cluster_of(instance, 2, INSTANCES[instance]))
    ):
        assert all(
            row[key] > 0
            for key in ("inter_node_bytes_per_step", "step_time_s", "tokens_per_s", "usd_per_million_tokens")
        )


def test_one_node_sends_nothing_across_nodes():
    (single,) = planner.forecast(
        workload("throughput"), planner.cluster_of("g6.12xlarge", 1, INSTANCES["g6.12xlarge"])
    )
    assert single.inter_node_bytes_per_step == 0 and single.tokens_per_s > 0


def test_deferred_accumulation_moves_fewer_bytes_per_token():
    cluster = planner.cluster_of("g6.12xlarge", 2, INSTANCES["g6.12xlarge"])
    plain = workload("throughput")
    deferred = dataclasses.replace(plain, grad_accum_steps=4, defer_grad_sync=True)
    for before, after in zip(
        planner.forecast(plain, cluster), planner.forecast(deferred, cluster), strict=True
    ):
        assert after.inter_node_bytes_per_step / 4 < before.inter_node_bytes_per_step
