"""The planner's figures: each has its source and date, AWS's texts read as numbers, and each measured
figure equals its report's raw JSON (the product declares them; only this test reads the record)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from infra.planner import figures
from infra.planner.figures import H200_THROUGHPUT, INSTANCES, MFU_POINTS, NCCL_TESTS, Figure, line_rate_gbps
from tests.harness.paths import REPO_ROOT as ROOT
from training.config.run_config import load_model_config
from training.metrics.flops import flops_per_token, peak_flops


def figures_in(value: object) -> list[Figure]:
    if isinstance(value, Figure):
        return [value]
    if dataclasses.is_dataclass(value):
        return [
            figure for field in dataclasses.fields(value) for figure in figures_in(getattr(value, field.name))
        ]
    return []


ALL_FIGURES = [
    *(figure for instance in INSTANCES.values() for figure in figures_in(instance)),
    *(figure for published in NCCL_TESTS for figure in figures_in(published)),
    figures.AWS_SAMPLE_EFA_STEPS_PER_S,
    figures.AWS_SAMPLE_TCP_STEPS_PER_S,
]


@pytest.mark.parametrize("figure", ALL_FIGURES, ids=lambda figure: f"{figure.value}")
def test_every_figure_has_a_source_and_a_date(figure):
    assert figure.value > 0
    assert figure.source.startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", figure.date)


def test_network_performance_texts_read_as_line_rates():
    """DescribeInstanceTypes' own spellings, as the fake AWS serves them for these types."""
    assert line_rate_gbps("40 Gigabit") == 40
    assert line_rate_gbps("4x 100 Gigabit") == 400
    assert line_rate_gbps("3200 Gigabit") == 3200
    assert line_rate_gbps("Up to 12.5 Gigabit") == 12.5
    assert line_rate_gbps("High") is None


def record_of(source: str, record: str) -> dict[str, Any]:
    """The raw JSON beside a report page: bench/reports/<name>.md keeps its files in <name>/."""
    loaded: dict[str, Any] = json.loads((ROOT / source.removesuffix(".md") / record).read_text())
    return loaded


def case_of(record: dict[str, Any], case: str) -> dict[str, Any]:
    rows = [row for value in record.values() if isinstance(value, list) for row in value]
    (row,) = [row for row in rows if isinstance(row, dict) and row.get("name") == case]
    return row


@pytest.mark.parametrize("point", MFU_POINTS, ids=lambda point: point.case)
def test_each_mfu_point_is_its_reports_case(point):
    """The record's own `mfu`, or its per-GPU tokens/s by the job's formula over the GPU's bf16 peak."""
    record = record_of(point.mfu.source, point.record)
    row = case_of(record, point.case)
    assert point.mfu.date == record["date"][:10]
    assert point.gpu_name == record["gpu_name"]
    assert point.tokens_per_micro_batch == row["seq_len"] * row["batch_size"]
    assert point.activation_checkpointing == row.get("activation_checkpointing", False)
    if "mfu" in row:
        assert point.mfu.value == row["mfu"]
    else:
        model = load_model_config(record["model_config"])
        peak = peak_flops(record["gpu_name"])
        assert peak is not None
        measured = row["tokens_per_s_per_gpu"] * flops_per_token(model, row["seq_len"]) / peak
        assert point.mfu.value == pytest.approx(measured, rel=1e-9)


@pytest.mark.parametrize("figure", H200_THROUGHPUT, ids=lambda figure: figure.case)
def test_each_throughput_figure_is_its_reports_case(figure):
    record = record_of(figure.tokens_per_s.source, figure.record)
    row = case_of(record, figure.case)
    assert figure.tokens_per_s.date == record["date"][:10]
    assert figure.tokens_per_s.value == row["tokens_per_s"]
    assert (row["seq_len"], row["batch_size"]) == (4096, figure.batch_size)
    assert figure.grad_accum_steps == row.get("grad_accum_steps", 1)
    assert figure.defer_grad_sync == row.get("defer_grad_sync", False)


def test_the_comparison_has_every_tuned_compiled_case_of_its_record():
    (source,) = {figure.tokens_per_s.source for figure in H200_THROUGHPUT}
    (record,) = {figure.record for figure in H200_THROUGHPUT}
    cases = [
        row["name"]
        for row in record_of(source, record)["variants"]
        if row["seq_len"] == 4096 and row["name"].startswith("tuned-compiled")
    ]
    assert [figure.case for figure in H200_THROUGHPUT] == cases


@pytest.mark.parametrize(
    "measured",
    [*(point.mfu for point in MFU_POINTS), *(figure.tokens_per_s for figure in H200_THROUGHPUT)],
    ids=lambda figure: f"{figure.value}",
)
def test_every_measured_figure_cites_a_report_page(measured):
    assert re.fullmatch(r"bench/reports/[a-z0-9-]+_[a-z0-9-]+_\d{6}\.md", measured.source)
    assert (ROOT / measured.source).is_file()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", measured.date)
