"""The communication planner: its numbers hang together, its facts are sourced, its command line
and the preview say what it computes, and docs/benchmarks.md quotes it."""

from __future__ import annotations

import dataclasses
import json
import re

import pulumi
import pytest

from infra.plan import planner as planner
from infra.plan.facts import INSTANCES, NCCL_TESTS, Fact, line_rate_gbps
from tests.harness.fake_aws import FakeAws
from tests.harness.program import ROOT, dev_config, run_program
from training.config.run_config import parse_flags


def facts_of(value: object) -> list[Fact]:
    if isinstance(value, Fact):
        return [value]
    if dataclasses.is_dataclass(value):
        return [fact for field in dataclasses.fields(value) for fact in facts_of(getattr(value, field.name))]
    return []


ALL_FACTS = [
    *(fact for instance in INSTANCES.values() for fact in facts_of(instance)),
    *(fact for figure in NCCL_TESTS for fact in facts_of(figure)),
    planner.AWS_SAMPLE_EFA_STEPS_PER_S,
    planner.AWS_SAMPLE_TCP_STEPS_PER_S,
]


@pytest.mark.parametrize("fact", ALL_FACTS, ids=lambda fact: f"{fact.value}")
def test_every_fact_has_a_source_and_a_date(fact):
    assert fact.value > 0
    assert fact.source.startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", fact.date)


def test_network_performance_texts_read_as_line_rates():
    """DescribeInstanceTypes' own spellings, as the fake AWS serves them for these types."""
    assert line_rate_gbps("40 Gigabit") == 40
    assert line_rate_gbps("4x 100 Gigabit") == 400
    assert line_rate_gbps("3200 Gigabit") == 3200
    assert line_rate_gbps("Up to 12.5 Gigabit") == 12.5
    assert line_rate_gbps("High") is None


def test_the_reduce_and_gather_widths_are_the_jobs_mixed_precision():
    torch = pytest.importorskip("torch")
    from training.distributed.parallelize import MIXED_PRECISION

    assert torch.empty((), dtype=MIXED_PRECISION.param_dtype).element_size() == planner.PARAM_BYTES
    assert torch.empty((), dtype=MIXED_PRECISION.reduce_dtype).element_size() == planner.REDUCE_BYTES


def test_the_price_list_item_reads_as_its_hourly_price():
    """pricing:GetProducts returns each product as a JSON text (AWS Price List API)."""
    item = {
        "product": {"attributes": {"instanceType": "g6.12xlarge"}},
        "terms": {
            "OnDemand": {
                "X.JRTCKXETXF": {
                    "priceDimensions": {
                        "X.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "4.6016000000"}}
                    }
                }
            }
        },
    }
    assert planner.on_demand_usd(json.dumps(item)) == 4.6016
    assert planner.on_demand_usd(json.dumps({"terms": {}})) is None


CASES = [(instance, preset) for instance in INSTANCES for preset in ("smoke", "throughput")]


def workload(preset: str) -> planner.Workload:
    found = planner.workload_of(parse_flags(["--preset", preset, "--workers", "8"], paths_here=False))
    assert found is not None
    return found


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_hsdp_moves_fewer_inter_node_bytes_than_fsdp(instance, preset):
    cluster = planner.cluster_of(instance, 2, INSTANCES[instance])
    fsdp, hsdp = planner.plan(workload(preset), cluster)
    assert (fsdp.name, hsdp.name) == ("FSDP", f"HSDP 2x{INSTANCES[instance].gpus}")
    assert 0 < hsdp.inter_node_bytes_per_step < fsdp.inter_node_bytes_per_step


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_a_slower_line_never_predicts_more_tokens(instance, preset):
    rates = [1, 5, 10, 25, 40, 100, 400, 3200]
    for nodes in (2, 4):
        plans = [
            planner.plan(workload(preset), planner.cluster_of(instance, nodes, INSTANCES[instance], rate))
            for rate in rates
        ]
        for strategy in range(2):
            tokens = [rows[strategy].tokens_per_s for rows in plans]
            assert tokens == sorted(tokens), tokens


@pytest.mark.parametrize(("instance", "preset"), CASES)
def test_every_figure_is_positive(instance, preset):
    for row in planner.plan_rows(
        planner.plan(workload(preset), planner.cluster_of(instance, 2, INSTANCES[instance]))
    ):
        assert all(
            row[key] > 0
            for key in ("inter_node_bytes_per_step", "step_time_s", "tokens_per_s", "usd_per_million_tokens")
        )


def test_one_node_sends_nothing_across_nodes():
    (single,) = planner.plan(
        workload("throughput"), planner.cluster_of("g6.12xlarge", 1, INSTANCES["g6.12xlarge"])
    )
    assert single.inter_node_bytes_per_step == 0 and single.tokens_per_s > 0


def test_deferred_accumulation_moves_fewer_bytes_per_token():
    cluster = planner.cluster_of("g6.12xlarge", 2, INSTANCES["g6.12xlarge"])
    plain = workload("throughput")
    deferred = dataclasses.replace(plain, grad_accum_steps=4, defer_grad_sync=True)
    for before, after in zip(planner.plan(plain, cluster), planner.plan(deferred, cluster), strict=True):
        assert after.inter_node_bytes_per_step / 4 < before.inter_node_bytes_per_step


def test_the_fsdp_bytes_are_the_rings_share_of_gathers_and_reduces():
    """AWS's sample (bf16 reduce): 3 x 7/8 x 2 bytes x 1.54B parameters, the issue's ~8 GB."""
    sample = planner.aws_sample_plan()
    assert sample.inter_node_bytes_per_step == pytest.approx(3 * 7 / 8 * 2 * 1_543_714_304)


def test_the_dev_stack_plans_as_json(capsys):
    assert planner.main(["--stack", "dev", "--json", "--offline"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["line_rate_gbps"] == 40
    assert [row["name"] for row in printed["strategies"]] == ["FSDP", "HSDP 2x4"]
    for row in printed["strategies"]:
        assert set(row) >= {
            "name",
            "inter_node_bytes_per_step",
            "step_time_s",
            "tokens_per_s",
            "usd_per_million_tokens",
        }


def test_a_lower_line_rate_lowers_tokens(capsys):
    planner.main(["--stack", "dev", "--json", "--offline"])
    efa = json.loads(capsys.readouterr().out)
    planner.main(["--stack", "dev", "--json", "--offline", "--line-rate-gbps", "10"])
    tcp = json.loads(capsys.readouterr().out)
    assert tcp["line_rate_gbps"] == 10
    for fast, slow in zip(efa["strategies"], tcp["strategies"], strict=True):
        assert slow["tokens_per_s"] < fast["tokens_per_s"]


def test_the_text_plan_marks_the_configured_strategy_and_warns(capsys):
    planner.main(["--stack", "dev", "--offline"])
    out = capsys.readouterr().out
    assert " *FSDP " in out  # the smoke preset runs plain FSDP (hsdpReplicas 1)
    assert (
        "warning: the training job is predicted network-bound" in out
        and "HSDP (training.hsdpReplicas: auto)" in out
    )


def test_an_unknown_stack_names_the_stacks_there():
    with pytest.raises(SystemExit, match="stacks here: dev"):
        planner.main(["--stack", "nowhere", "--offline"])


def test_preview_logs_the_plan_and_warns_when_network_bound(monkeypatch):
    infos: list[str] = []
    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: infos.append(message))
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    run_program(dev_config(), FakeAws(region="us-east-2"))
    assert [info for info in infos if info.startswith("plan for 2 x 4 NVIDIA L4 at 40 Gbps")]
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


def test_the_benchmark_comparison_is_what_the_planner_computes():
    document = (ROOT / "docs" / "benchmarks.md").read_text()
    assert planner.comparison_table() in document


def stubbed_aws(monkeypatch, instance_type: str, network: str | None, price: str | None):
    """boto3 clients whose answers botocore checks against the EC2 and Price List API models."""
    import boto3
    from botocore.stub import Stubber

    session = boto3.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-2")
    clients = {"ec2": session.client("ec2"), "pricing": session.client("pricing", region_name="us-east-1")}
    ec2 = Stubber(clients["ec2"])
    pricing = Stubber(clients["pricing"])
    if network is None:
        ec2.add_client_error("describe_instance_types", "UnauthorizedOperation")
    else:
        ec2.add_response(
            "describe_instance_types",
            {
                "InstanceTypes": [
                    {"InstanceType": instance_type, "NetworkInfo": {"NetworkPerformance": network}}
                ]
            },
            {"InstanceTypes": [instance_type]},
        )
        item = {"terms": {"OnDemand": {"T": {"priceDimensions": {"D": {"pricePerUnit": {"USD": price}}}}}}}
        pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [json.dumps(item)]})
    ec2.activate()
    pricing.activate()
    monkeypatch.setattr(boto3, "client", lambda service, region_name=None: clients[service])


def test_aws_answers_replace_the_shipped_line_rate_and_price(monkeypatch):
    stubbed_aws(monkeypatch, "g6.12xlarge", "50 Gigabit", "5.0000000000")
    fact, source = planner.refreshed("g6.12xlarge", "us-east-2", INSTANCES["g6.12xlarge"])
    assert (fact.line_rate_gbps.value, fact.usd_per_hour.value, source) == (
        50,
        5.0,
        "line rate and price from AWS",
    )
    assert fact.line_rate_gbps.source == "ec2:DescribeInstanceTypes"


def test_without_aws_the_shipped_facts_stay(monkeypatch):
    stubbed_aws(monkeypatch, "g6.12xlarge", None, None)
    fact, source = planner.refreshed("g6.12xlarge", "us-east-2", INSTANCES["g6.12xlarge"])
    assert fact == INSTANCES["g6.12xlarge"] and source.startswith("shipped facts (ClientError")


def test_the_preview_returns_the_configured_strategys_prediction_for_the_stack_outputs(monkeypatch):
    """The stack exports it as `training.predictedTokensPerS`, beside the measured `tokensPerS`."""
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: None)
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: None)
    config = parse_flags(["--preset", "smoke", "--workers", "8", "--use-gpu"], paths_here=False)
    predicted = planner.log_plan(config, "g6.12xlarge", 2, "40 Gigabit")
    fact = INSTANCES["g6.12xlarge"]
    cluster = planner.cluster_of("g6.12xlarge", 2, fact, 40.0)
    workload = planner.workload_of(config)
    assert workload is not None
    configured = planner.strategy_plan(workload, cluster, planner.configured_replicas(config, cluster))
    assert predicted == configured and configured.tokens_per_s > 0
    assert planner.log_plan(config, "g9.unknown", 2, "40 Gigabit") is None


def test_after_a_run_the_plan_meets_the_measured_step_time_and_bytes_per_step():
    """The stack's `training.planVsMeasured`: the run's summary (EFA bytes per node, sent plus
    received) against the configured strategy's prediction (bytes each way through a node's NIC)."""
    config = parse_flags(["--preset", "smoke", "--workers", "8", "--use-gpu"], paths_here=False)
    cluster = planner.cluster_of("g6.12xlarge", 2, INSTANCES["g6.12xlarge"], 40.0)
    workload = planner.workload_of(config)
    assert workload is not None
    plan = planner.strategy_plan(workload, cluster, 1)
    summary = {
        "step_time_s": 2 * plan.step_time_s,
        "efa_bytes_per_step": {
            "pod-a": 2 * plan.inter_node_bytes_per_step,
            "pod-b": 2.2 * plan.inter_node_bytes_per_step,
        },
    }
    compared = planner.measured_against_plan(plan, summary)
    assert compared["predictedStepTimeS"] == plan.step_time_s and compared["stepTimeRatio"] == 2.0
    assert compared["predictedBytesPerStep"] == plan.inter_node_bytes_per_step
    assert compared["measuredBytesPerStep"] == pytest.approx(1.05 * plan.inter_node_bytes_per_step)
    assert compared["bytesPerStepRatio"] == 1.05
    # A run without EFA (or a plan without facts) leaves its side and the ratio empty, not zero.
    empty = planner.measured_against_plan(plan, {"step_time_s": plan.step_time_s})
    assert empty["measuredBytesPerStep"] is None and empty["bytesPerStepRatio"] is None
    assert empty["stepTimeRatio"] == 1.0
    assert planner.measured_against_plan(None, summary)["stepTimeRatio"] is None
