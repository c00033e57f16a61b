"""The forecast at preview and after a run: the log lines, the warning, the prediction the stack exports
and the run's measurements beside it."""

from __future__ import annotations

import pulumi
import pytest

from infra.planner import planner, report
from infra.planner.cost import PredictedRun
from infra.planner.figures import INSTANCES
from tests.harness.fake_aws import FakeAws
from tests.harness.program import dev_config, run_program
from training.config.run_config import parse_flags


def test_preview_logs_the_forecast_and_warns_when_network_bound(monkeypatch):
    infos: list[str] = []
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: infos.append(message))
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    run_program(dev_config(), FakeAws(region="us-east-2"))
    assert [info for info in infos if info.startswith("forecast for 2 x 4 NVIDIA L4 at 40 Gbps")]
    assert [warning for warning in warnings if "predicted network-bound" in warning]
    infos.clear()
    warnings.clear()
    run_program(dev_config(training='{"preset": "throughput"}'), FakeAws(region="us-east-2"))
    assert [
        info
        for info in infos
        if " *HSDP 2x4" in info and "predicted run: 50 steps x 2.17 s = 1.8 min" in info
    ]
    assert not [warning for warning in warnings if "network-bound" in warning]


def test_the_preview_returns_the_configured_strategys_prediction_for_the_stack_outputs(monkeypatch):
    """The stack exports it as `training.predictedTokensPerS`, beside the measured `tokensPerS`."""
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: None)
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: None)
    config = parse_flags(["--preset", "smoke", "--workers", "8", "--use-gpu"], paths_here=False)
    predicted = report.log_forecast(config, "g6.12xlarge", 2, "40 Gigabit")
    figures = INSTANCES["g6.12xlarge"]
    cluster = planner.cluster_of("g6.12xlarge", 2, figures, 40.0)
    workload = planner.workload_of(config)
    assert workload is not None
    configured = planner.strategy_forecast(workload, cluster, planner.configured_replicas(config, cluster))
    assert predicted == configured and configured.tokens_per_s > 0
    assert report.log_forecast(config, "g9.unknown", 2, "40 Gigabit") is None


def test_after_a_run_the_forecast_meets_the_measured_step_time_and_bytes_per_step():
    """The stack's `training.forecastVsMeasured`: the run's summary (EFA bytes per node, sent plus
    received) against the configured strategy's prediction (bytes each way through a node's NIC)."""
    config = parse_flags(["--preset", "smoke", "--workers", "8", "--use-gpu"], paths_here=False)
    cluster = planner.cluster_of("g6.12xlarge", 2, INSTANCES["g6.12xlarge"], 40.0)
    workload = planner.workload_of(config)
    assert workload is not None
    forecast = planner.strategy_forecast(workload, cluster, 1)
    summary = {
        "step_time_s": 2 * forecast.step_time_s,
        "efa_bytes_per_step": {
            "pod-a": 2 * forecast.inter_node_bytes_per_step,
            "pod-b": 2.2 * forecast.inter_node_bytes_per_step,
        },
    }
    recorded = PredictedRun(
        usd_per_gpu_node_hour=4.6016,
        price_basis="a list price",
        step_time_s=forecast.step_time_s,
        bytes_per_step=forecast.inter_node_bytes_per_step,
    )
    compared = report.measured_against_forecast(recorded, summary)
    assert compared["predictedStepTimeS"] == forecast.step_time_s and compared["stepTimeRatio"] == 2.0
    assert compared["predictedBytesPerStep"] == forecast.inter_node_bytes_per_step
    assert compared["measuredBytesPerStep"] == pytest.approx(1.05 * forecast.inter_node_bytes_per_step)
    assert compared["bytesPerStepRatio"] == 1.05
    # A run without EFA (or a forecast without figures) leaves its side and the ratio empty, not zero.
    empty = report.measured_against_forecast(recorded, {"step_time_s": forecast.step_time_s})
    assert empty["measuredBytesPerStep"] is None and empty["bytesPerStepRatio"] is None
    assert empty["stepTimeRatio"] == 1.0
    assert report.measured_against_forecast(None, summary)["stepTimeRatio"] is None
