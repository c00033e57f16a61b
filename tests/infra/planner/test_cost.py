"""The cost figures: EC2's per-second billing with its minimum, the price and its basis, tokens and
US$ per million of them, the planner's prediction, and the stack per hour at rest."""

from __future__ import annotations

import datetime

import pytest

from infra.planner.cost import (
    UNRECORDED_PRICE,
    CostBasis,
    PredictedRun,
    Prediction,
    Price,
    StackShape,
    at_rest_usd_per_hour,
    billed_seconds,
    capacity_block_price,
    gpu_node_hours,
    idle_gpu_cost,
    list_price,
    measured_cost,
    predicted_cost,
    tokens_trained,
)
from tests.harness.fake_aws import price_list_item

T0 = datetime.datetime(2026, 12, 5, 6, 0, 0, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("ran_s", "billed"),
    [(0, 0), (-5, 0), (1, 60), (59.2, 60), (60, 60), (61, 61), (3600.4, 3601)],
)
def test_ec2_bills_whole_seconds_and_a_minute_at_least(ran_s, billed):
    assert billed_seconds(T0, at(ran_s)) == billed


def test_node_hours_add_each_nodes_billed_seconds_from_its_launch_to_its_end():
    assert gpu_node_hours([(T0, at(3600)), (at(1800), at(3600))]) == pytest.approx(1.5)
    assert gpu_node_hours([(T0, at(3600)), (at(3590), at(3600))]) == pytest.approx((3600 + 60) / 3600)


def test_the_price_lists_item_is_the_price_and_names_its_basis():
    price = list_price(
        "g6.12xlarge", "us-east-2", price_list_item("g6.12xlarge", "us-east-2", "4.6016000000"), None
    )
    assert price == Price(
        4.6016, "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview"
    )


def test_a_refused_price_list_falls_back_to_the_shipped_price_saying_so():
    price = list_price("g6.12xlarge", "us-east-2", None, "AccessDeniedException: not authorized")
    assert price.usd_per_hour == 4.6016
    assert "shipped with the stack (us-east-1, https://aws.amazon.com/ec2/pricing/on-demand/" in price.basis
    assert price.basis.endswith("the Price List was not used: AccessDeniedException: not authorized")
    unknown = list_price("c7i.large", "us-east-2", None, "refused")
    assert unknown.usd_per_hour is None and "none is shipped" in unknown.basis


def test_a_capacity_block_has_no_hourly_price_and_says_why():
    price = capacity_block_price("cr-0123456789abcdef0")
    assert price.usd_per_hour is None
    assert "upfront fee" in price.basis and "no EC2 API returns the fee of a purchased block" in price.basis


def test_tokens_come_from_tokens_seen_else_steps_times_the_steps_tokens():
    assert tokens_trained({"tokens_seen": 81920, "steps": 5, "tokens_per_s": 1, "step_time_s": 1}) == 81920
    assert tokens_trained({"steps": 5, "tokens_per_s": 530.6, "step_time_s": 1.93}) == 5 * 1024
    assert tokens_trained({"steps": 5}) is None and tokens_trained(None) is None


BASIS = CostBasis(Price(4.0, "a list price"), Prediction(20, 1.8, 500.0, 2, 3e9), {"gpuNodesAtZero": 0.36})
RECORDED = BASIS.predicted_run


def test_the_prediction_is_steps_times_step_time_times_the_fleet_at_the_named_price():
    predicted = predicted_cost(BASIS)
    assert predicted["predictedUsd"] == round(20 * 1.8 * 2 * 4.0 / 3600, 2)
    assert predicted["predictedUsdPerMillionTokens"] == round(2 * 4.0 / 3600 / 500 * 1e6, 2)
    assert predicted["priceBasis"] == "a list price" and predicted["atRestUsdPerHour"] == {
        "gpuNodesAtZero": 0.36
    }
    assert "not the invoice" in predicted["note"]
    without = predicted_cost(CostBasis(capacity_block_price("cr-1"), BASIS.prediction, {}))
    assert without["predictedUsd"] is None and without["usdPerGpuNodeHour"] is None


NODES = {
    "node-a": {"instanceId": "i-1", "launchTime": "2026-12-05T06:00:00+00:00"},
    "node-b": {"instanceId": "i-2", "launchTime": "2026-12-05T06:30:00+00:00"},
}


def test_the_measured_cost_runs_to_the_output_or_to_the_release():
    summary = {"tokens_seen": 1_000_000}
    measured = measured_cost(RECORDED, NODES, None, "2026-12-05T07:00:00+00:00", summary)
    assert measured["gpuNodeHours"] == 1.5 and measured["usd"] == 6.0
    assert (measured["usdPerGpuNodeHour"], measured["priceBasis"]) == (4.0, "a list price")
    assert measured["usdPerMillionTokens"] == 6.0 and measured["to"] == "the output's time"
    released = measured_cost(
        RECORDED, NODES, None, "2026-12-05T09:00:00+00:00", summary, "2026-12-05T08:00:00Z"
    )
    assert released["gpuNodeHours"] == 3.5 and released["to"] == "the GPU nodes' release"
    assert released["endedAt"] == "2026-12-05T08:00:00Z"


def test_without_launch_times_the_measured_cost_is_unavailable_with_the_reason():
    refused = measured_cost(
        RECORDED, None, "AWS refused ec2:DescribeInstances", "2026-12-05T07:00:00+00:00", {}
    )
    assert refused["gpuNodeHours"] is None and refused["usd"] is None
    assert refused["unavailable"] == "AWS refused ec2:DescribeInstances"
    before = measured_cost(RECORDED, None, None, None, None)
    assert before["unavailable"] == "no training run has reported its GPU nodes yet"
    block = measured_cost(
        CostBasis(capacity_block_price("cr-1"), None, {}).predicted_run,
        NODES,
        None,
        "2026-12-05T07:00:00Z",
        {},
    )
    assert block["gpuNodeHours"] == 1.5 and block["usd"] is None


def test_the_measured_cost_is_at_the_price_the_run_recorded_and_none_without_one():
    """The run records its price and forecast (`PredictedRun`, the TrainingRun's `planned` input and output):
    a later Price List leaves its cost as it was; a run that recorded none has no US$ figure, and says so."""
    recorded = PredictedRun.recorded(
        {
            "usd_per_gpu_node_hour": 4.0,
            "price_basis": "a list price",
            "step_time_s": 1.8,
            "bytes_per_step": 3e9,
        },
        "training.cost.measured",
    )
    assert recorded == RECORDED
    assert (
        PredictedRun(
            usd_per_gpu_node_hour=4.0, price_basis="a list price", step_time_s=1.8, bytes_per_step=3e9
        )
        == RECORDED
    )
    assert CostBasis(capacity_block_price("cr-1"), None, {}).predicted_run.step_time_s is None
    unrecorded = measured_cost(
        PredictedRun.recorded(None, "training.cost.measured"), NODES, None, "2026-12-05T07:00:00+00:00", {}
    )
    assert unrecorded["gpuNodeHours"] == 1.5 and unrecorded["usd"] is None
    assert unrecorded["usdPerGpuNodeHour"] is None and unrecorded["priceBasis"] == UNRECORDED_PRICE


def shape(**changes) -> StackShape:
    values = {
        "version_status": "STANDARD_SUPPORT",
        "system_nodes": 1,
        "system_price": Price(0.2016, "list"),
        "system_root_gib": 80,
        "gpu_nodes": 2,
        "gpu_price": Price(4.6016, "list"),
        "gpu_root_gib": 200,
        "nat_gateways": 1,
    }
    return StackShape(**{**values, **changes})


def test_at_rest_the_stack_pays_control_plane_system_node_nat_and_volumes():
    rest = at_rest_usd_per_hour(shape())
    gp3 = 0.08 / 730
    assert rest["parts"] == {
        "controlPlane": 0.1,
        "systemNodes": 0.2016,
        "natGateways": 0.05,
        "systemVolumes": round(80 * gp3, 4),
        "gpuNodes": 9.2032,
        "gpuVolumes": round(400 * gp3, 4),
    }
    assert rest["gpuNodesAtZero"] == round(0.1 + 0.2016 + 0.05 + round(80 * gp3, 4), 4)
    assert rest["gpuNodesRunning"] == round(sum(rest["parts"].values()), 4)
    assert rest["controlPlaneSupport"] == "standard"


def test_extended_support_costs_six_times_the_control_plane_and_unknown_parts_leave_totals_unknown():
    extended = at_rest_usd_per_hour(shape(version_status="EXTENDED_SUPPORT"))
    assert extended["parts"]["controlPlane"] == 0.6 and extended["controlPlaneSupport"] == "extended"
    unread = at_rest_usd_per_hour(shape(version_status=None))
    assert unread["controlPlaneSupport"] == "standard (the version's status was not read)"
    block = at_rest_usd_per_hour(shape(gpu_price=capacity_block_price("cr-1")))
    assert block["gpuNodesRunning"] is None and block["gpuNodesAtZero"] is not None


def test_idle_gpu_nodes_are_priced_only_where_keeping_them_costs_more():
    price = Price(4.6016, "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview")
    on_demand = idle_gpu_cost(2, "g6.12xlarge", price, None, capacity_block=False)
    assert (
        "bill US$ 9.20 an hour while idle (2 x g6.12xlarge at US$ 4.6016/h, On-Demand list price" in on_demand
    )
    for block in (False, True):
        reserved = idle_gpu_cost(2, "g6.12xlarge", price, "cr-0123", capacity_block=block)
        assert "US$" not in reserved and "releasing them would save nothing" in reserved
    unpriced = idle_gpu_cost(2, "g6.12xlarge", Price(None, "no price for g6.12xlarge"), None, False)
    assert "US$" not in unpriced and "(no price for g6.12xlarge)" in unpriced


def test_an_instance_that_stopped_counts_to_its_stop_and_one_not_counted_is_named():
    """A node replaced during the run: its instance to its stop, the replacement's from its launch; an
    instance EC2 does not list is named in `notCounted`, the hours of the others counted."""
    nodes = {
        **NODES,
        "node-b": {**NODES["node-b"], "stoppedAt": "2026-12-05T06:45:00+00:00"},
        "node-c": {"instanceId": "i-3", "launchTime": "2026-12-05T06:46:00+00:00"},
        "node-d": {"instanceId": "i-4", "unavailable": "ec2:DescribeInstances does not list it"},
    }
    measured = measured_cost(RECORDED, nodes, None, "2026-12-05T07:00:00+00:00", {"tokens_seen": 10**6})
    assert measured["gpuNodeHours"] == round((3600 + 900 + 840) / 3600, 4)
    assert measured["notCounted"] == {"i-4": "ec2:DescribeInstances does not list it"}
    late = {"node-b": {**NODES["node-b"], "stoppedAt": "2026-12-05T07:10:00+00:00"}}
    assert measured_cost(RECORDED, late, None, "2026-12-05T07:00:00+00:00", {})["gpuNodeHours"] == 0.5
    none = measured_cost(RECORDED, {"node-d": nodes["node-d"]}, None, "2026-12-05T07:00:00+00:00", {})
    assert none["gpuNodeHours"] is None
    assert none["unavailable"] == (
        "no GPU node's instance could be counted: i-4: ec2:DescribeInstances does not list it"
    )


def test_with_the_tcp_baseline_the_per_token_figure_counts_both_jobs_tokens_and_says_so():
    """The nodes' hours hold the TCP baseline's run too: its tokens are counted beside the job's."""
    alone = measured_cost(RECORDED, NODES, None, "2026-12-05T07:00:00+00:00", {"tokens_seen": 10**6})
    assert alone["usdPerMillionTokens"] == 6.0 and alone["tcpBaselineTokens"] is None
    assert alone["usdPerMillionTokensOf"].endswith("over the job's tokens")
    both = measured_cost(
        RECORDED,
        NODES,
        None,
        "2026-12-05T07:00:00+00:00",
        {"tokens_seen": 10**6},
        None,
        {"tokens_seen": 5 * 10**5},
    )
    assert (both["usd"], both["tokens"], both["tcpBaselineTokens"]) == (6.0, 10**6, 5 * 10**5)
    assert both["usdPerMillionTokens"] == 4.0
    assert (
        "the TCP baseline" in both["usdPerMillionTokensOf"] and "both jobs" in both["usdPerMillionTokensOf"]
    )
    unknown = measured_cost(
        RECORDED, NODES, None, "2026-12-05T07:00:00+00:00", {"tokens_seen": 10**6}, None, {}
    )
    assert unknown["usdPerMillionTokens"] is None  # not the baseline's hours over the job's tokens alone
