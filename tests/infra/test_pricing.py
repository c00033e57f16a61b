"""training.cost at preview: the Price List's price through a us-east-1 provider, the shipped
prices when it refuses, a Capacity Block's upfront fee, the NAT gateways it counts; a run's cost at
the price recorded with it."""

from __future__ import annotations

import json

import pulumi
import pytest

from infra import pricing
from infra.planner.refresh import price_list_filters
from infra.resources.network import NAT_GATEWAYS
from tests.harness.fake_aws import (
    LIST_PRICES,
    AwsApiError,
    FakeAws,
    FakeAwsMocks,
    capacity_reservation,
)
from tests.harness.preview_queries import (
    RESERVATION,
    RUN_OUTPUTS,
    resolved,
)
from tests.harness.program import (
    ACCOUNT,
    ROOT,
    TRAINING_RUN,
    config_of,
    dev_config,
    run_program,
)

PRICE_LIST = "aws:pricing/getProduct:getProduct"


DEPLOYER = f"arn:aws:iam::{ACCOUNT}:role/ml-deployer"


def test_the_cost_names_the_price_lists_price_read_through_a_us_east_1_provider():
    """us-east-2 has no Price List endpoint: the invoke goes through the `price-list` provider in
    us-east-1 with the stack's profile and role, filtering on the stack's region."""
    fake = FakeAws(region="us-east-2")
    config = dev_config(**{"aws:profile": "ml", "aws:assumeRole": json.dumps({"roleArn": DEPLOYER})})
    plan = run_program(config, fake)
    cost = plan.outputs["training"]["cost"]
    assert cost["priceBasis"] == "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview"
    assert cost["usdPerGpuNodeHour"] == 4.6016
    assert cost["atRestUsdPerHour"]["systemNodeBasis"].endswith(
        "of m7i.xlarge in us-east-2, AWS Price List at preview"
    )
    assert cost["atRestUsdPerHour"]["parts"]["gpuNodes"] == 2 * 4.6016
    assert cost["predictedUsd"] is not None and "not the invoice" in cost["note"]
    (provider,) = plan.of_type("pulumi:providers:aws")
    assert (provider.name, provider.inputs["region"], provider.inputs["profile"]) == (
        "price-list",
        "us-east-1",
        "ml",
    )
    assert json.loads(provider.inputs["assumeRoles"])[0]["roleArn"] == DEPLOYER
    priced = [
        {f["field"]: f["value"] for f in args["filters"]} for token, args in fake.calls if token == PRICE_LIST
    ]
    assert [(f["instanceType"], f["regionCode"]) for f in priced] == [
        ("m7i.xlarge", "us-east-2"),
        ("g6.12xlarge", "us-east-2"),
    ]
    assert all(f["marketoption"] == "OnDemand" and f["capacitystatus"] == "Used" for f in priced)
    assert isinstance(cost["measured"], pulumi.Output)  # known once the TrainingRun has run


def test_in_a_price_list_region_the_stacks_own_provider_asks():
    plan = run_program(config_of(ROOT / "Pulumi.us-east-1.yaml"), FakeAws(region="us-east-1"))
    assert plan.of_type("pulumi:providers:aws") == []
    assert plan.outputs["training"]["cost"]["priceBasis"].endswith("in us-east-1, AWS Price List at preview")


def test_a_refused_price_list_falls_back_to_the_shipped_prices_naming_the_refusal():
    plan = run_program(dev_config(), FakeAws(region="us-east-2", denied={PRICE_LIST}))
    cost = plan.outputs["training"]["cost"]
    assert cost["usdPerGpuNodeHour"] == 4.6016
    assert cost["priceBasis"].startswith(
        "On-Demand list price of g6.12xlarge shipped with the stack (us-east-1"
    )
    assert (
        "the Price List was not used" in cost["priceBasis"] and "AccessDeniedException" in cost["priceBasis"]
    )
    assert cost["atRestUsdPerHour"]["parts"]["systemNodes"] == 0.2016


def test_a_capacity_blocks_cost_is_its_upfront_fee_which_no_api_returns():
    fake = FakeAws(
        region="us-east-2",
        reservations={RESERVATION: capacity_reservation("us-east-2b", reservation_type="capacity-block")},
    )
    cost = run_program(dev_config(capacityReservationId=RESERVATION), fake).outputs["training"]["cost"]
    assert cost["usdPerGpuNodeHour"] is None and cost["predictedUsd"] is None
    assert cost["priceBasis"].startswith(f"Capacity Block {RESERVATION}: its upfront fee")
    assert cost["atRestUsdPerHour"]["gpuNodesRunning"] is None
    assert cost["atRestUsdPerHour"]["gpuNodesAtZero"] is not None


def test_the_network_has_the_nat_gateways_the_cost_counts(stack_plan):
    _, plan = stack_plan
    assert len(plan.of_type("aws:ec2/natGateway:NatGateway")) == NAT_GATEWAYS
    assert len(plan.of_type("aws:ec2/eip:Eip")) == NAT_GATEWAYS


def test_an_unchanged_run_keeps_the_price_and_forecast_it_was_billed_and_forecast_at(monkeypatch):
    """The first `pulumi up` runs the job at the Price List's price; the run records that price and the
    planner's prediction with it (its `planned` input, among its outputs). Two later `pulumi up`s,
    after AWS changed the price, leave the run alone (no input that reruns it changed, so the engine
    keeps its outputs): `training.cost.measured` and `forecastVsMeasured` are the same in both, at the
    run's price, while the preview's own figures follow the Price List. A run that runs again records
    the new price."""
    fake = FakeAws(region="us-east-2")
    first = run_program(dev_config(), fake)
    inputs = {key: value for key, value in first.one(TRAINING_RUN).inputs.items() if key != "__provider"}
    recorded = {"training": {**inputs, **RUN_OUTPUTS}}
    assert inputs["planned"]["usd_per_gpu_node_hour"] == 4.6016

    costs, compared = [], []
    for usd in ("5.1000000000", "3.9000000000"):
        monkeypatch.setitem(LIST_PRICES, "g6.12xlarge", usd)
        later = run_program(dev_config(), fake, recorded=recorded, preview=False)
        assert later.outputs["training"]["cost"]["usdPerGpuNodeHour"] == float(usd)  # the preview's, today's
        costs.append(resolved(later.outputs["training"]["cost"]["measured"]))
        compared.append(resolved(later.outputs["training"]["forecastVsMeasured"]))
    assert costs[0] == costs[1] and compared[0] == compared[1]
    measured = costs[0]
    # Node a ran 2 h, node b 1 h 30 min, at the recorded 4.6016 a node-hour.
    assert (measured["gpuNodeHours"], measured["usd"]) == (3.5, round(3.5 * 4.6016, 2))
    assert measured["usdPerGpuNodeHour"] == 4.6016
    assert (
        measured["priceBasis"]
        == "On-Demand list price of g6.12xlarge in us-east-2, AWS Price List at preview"
    )
    assert compared[0]["predictedStepTimeS"] == inputs["planned"]["step_time_s"]
    assert compared[0]["stepTimeRatio"] == round(3.0 / inputs["planned"]["step_time_s"], 3)

    # A changed job input runs the job again (Diff replaces it), and the new run records today's price.
    rerun = run_program(
        dev_config(training='{"preset": "smoke", "steps": 21}'), fake, recorded=recorded, preview=False
    )
    assert resolved(rerun.outputs["training"]["cost"]["measured"])["usdPerGpuNodeHour"] == 3.9


def test_the_forecast_comparison_is_also_exported_under_its_former_key():
    """`training.forecastVsMeasured` is exported a second time as `planVsMeasured`, its former key, for
    one release (UPGRADING.md): the same run's recorded forecast beside its measurements."""
    fake = FakeAws(region="us-east-2")
    first = run_program(dev_config(), fake)
    inputs = {key: value for key, value in first.one(TRAINING_RUN).inputs.items() if key != "__provider"}
    later = run_program(dev_config(), fake, recorded={"training": {**inputs, **RUN_OUTPUTS}}, preview=False)
    training = later.outputs["training"]
    compared = resolved(training["forecastVsMeasured"])
    assert resolved(training["planVsMeasured"]) == compared
    assert compared["predictedStepTimeS"] == inputs["planned"]["step_time_s"]
    assert compared["measuredStepTimeS"] == 3.0


def test_a_type_the_price_list_also_sells_as_a_capacity_block_is_priced_on_demand():
    """p5 (and p4d) are also Capacity Block products of the same attributes but `marketoption`: the
    query names OnDemand, so the one product is found, not two (which fail the data source and
    would leave the shipped price)."""
    fake = FakeAws(region="us-east-1")
    pulumi.runtime.set_mocks(FakeAwsMocks(fake), preview=True)
    price = pricing._price("p5.48xlarge", "us-east-1", None)
    assert (price.usd_per_hour, price.basis) == (
        55.04,
        "On-Demand list price of p5.48xlarge in us-east-1, AWS Price List at preview",
    )
    unnamed = [
        {"field": field, "value": value}
        for field, value in price_list_filters("p5.48xlarge", "us-east-1").items()
        if field != "marketoption"
    ]
    with pytest.raises(AwsApiError, match="not precise enough"):
        fake.call(PRICE_LIST, {"serviceCode": "AmazonEC2", "filters": unnamed})
