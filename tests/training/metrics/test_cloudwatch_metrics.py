"""The job's CloudWatch vocabulary, declared once: the metric names are the fields of the job's
`TRAIN_STEP` line and of the fabric probe's report, each unit is one of CloudWatch's `StandardUnit`
values in botocore's model of the API, and the namespace is one CloudWatch accepts."""

from __future__ import annotations

import dataclasses
import json

import botocore.session

from tests.harness.paths import REPO_ROOT
from training.metrics.cloudwatch_metrics import (
    BUSBW_METRIC,
    CLUSTER_DIMENSION,
    EFA_METRIC,
    GATE_DIMENSIONS,
    METRICS,
    NAMESPACE,
    NODE_DIMENSIONS,
    RESTART_METRICS,
    RUN_DIMENSIONS,
    STEP_METRICS,
)
from training.metrics.report import StepMetrics

# The probe's JSON line as the gate's driver printed it on a cluster (tests/fixtures/training_run/README.md).
PROBE_REPORT = json.loads(
    (REPO_ROOT / "tests/fixtures/training_run/driver_probe.log").read_text().strip().splitlines()[-1]
)


def test_the_step_metrics_are_fields_of_the_step_line_and_busbw_a_field_of_the_probes_report():
    fields = {field.name for field in dataclasses.fields(StepMetrics)}
    assert {*STEP_METRICS, EFA_METRIC} <= fields
    assert PROBE_REPORT["results"] and all(BUSBW_METRIC in row for row in PROBE_REPORT["results"])


def test_every_metric_has_a_unit_of_cloudwatchs_model_and_its_dimensions_start_with_the_cluster():
    units = botocore.session.get_session().get_service_model("cloudwatch").shape_for("StandardUnit").enum
    assert {unit for unit, _ in METRICS.values()} <= set(units)
    assert METRICS.keys() == {*STEP_METRICS, *RESTART_METRICS, EFA_METRIC, BUSBW_METRIC}
    for dimensions in (RUN_DIMENSIONS, NODE_DIMENSIONS, GATE_DIMENSIONS):
        assert dimensions[0] == CLUSTER_DIMENSION and len(set(dimensions)) == len(dimensions)


def test_the_namespace_is_a_custom_one_cloudwatch_accepts():
    """PutMetricData refuses a namespace starting with "AWS/"; botocore's model bounds its length."""
    shape = botocore.session.get_session().get_service_model("cloudwatch").shape_for("Namespace")
    assert not NAMESPACE.startswith("AWS/")
    assert shape.metadata["min"] <= len(NAMESPACE) <= shape.metadata["max"]
