"""The planner's figures refreshed from AWS: the Price List's items and DescribeInstanceTypes' line rates
replace the shipped ones, which stay without credentials."""

from __future__ import annotations

import json

from infra.planner import refresh
from infra.planner.figures import INSTANCES
from infra.planner.refresh import ON_DEMAND_LINUX, price_list_filters


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
    assert refresh.on_demand_usd(json.dumps(item)) == 4.6016
    assert refresh.on_demand_usd(json.dumps({"terms": {}})) is None


def stubbed_aws(monkeypatch, instance_type: str, network: str | None, *prices: str):
    """boto3 clients whose answers botocore checks against the EC2 and Price List API models; the
    Price List answers `prices` (one product each) to the query for the type's On-Demand Linux price
    in us-east-1, and to no other."""
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
        items = [
            json.dumps(
                {"terms": {"OnDemand": {"T": {"priceDimensions": {"D": {"pricePerUnit": {"USD": usd}}}}}}}
            )
            for usd in prices
        ]
        query = {
            "ServiceCode": "AmazonEC2",
            "Filters": [
                {"Type": "TERM_MATCH", "Field": key, "Value": value}
                for key, value in price_list_filters(instance_type, "us-east-1").items()
            ],
        }
        pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": items}, query)
    ec2.activate()
    pricing.activate()
    monkeypatch.setattr(boto3, "client", lambda service, region_name=None: clients[service])


def test_aws_answers_replace_the_shipped_line_rate_and_price(monkeypatch):
    stubbed_aws(monkeypatch, "g6.12xlarge", "50 Gigabit", "5.0000000000")
    figures, source = refresh.refreshed("g6.12xlarge", "us-east-2", INSTANCES["g6.12xlarge"])
    assert (figures.line_rate_gbps.value, figures.usd_per_hour.value, source) == (
        50,
        5.0,
        "line rate and price from AWS",
    )
    assert figures.line_rate_gbps.source == "ec2:DescribeInstanceTypes"


def test_without_aws_the_shipped_figures_stay(monkeypatch):
    stubbed_aws(monkeypatch, "g6.12xlarge", None)
    figures, source = refresh.refreshed("g6.12xlarge", "us-east-2", INSTANCES["g6.12xlarge"])
    assert figures == INSTANCES["g6.12xlarge"] and source.startswith("shipped figures (ClientError")


def test_the_query_names_the_on_demand_market_and_more_than_one_product_keeps_the_shipped_price(monkeypatch):
    """p5 is also sold as Capacity Blocks, a product alike but for `marketoption`: the query names
    OnDemand, and an answer of two products is no price of the type (the first is not taken)."""
    assert ON_DEMAND_LINUX["marketoption"] == "OnDemand"
    stubbed_aws(monkeypatch, "p5.48xlarge", "3200 Gigabit", "55.0400000000", "0.0000000000")
    figures, source = refresh.refreshed("p5.48xlarge", "us-east-2", INSTANCES["p5.48xlarge"])
    assert figures.usd_per_hour == INSTANCES["p5.48xlarge"].usd_per_hour
    assert source == (
        "line rate from AWS, the shipped price: the Price List answered 2 products, not one for On-Demand "
        "Linux p5.48xlarge in us-east-1"
    )
