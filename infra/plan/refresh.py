"""The planner's instance facts as AWS states them now: the line rate (ec2:DescribeInstanceTypes)
and the us-east-1 On-Demand price (pricing:GetProducts), the shipped ones without credentials."""

from __future__ import annotations

import dataclasses
import datetime
import json

from infra.plan.figures import Figure, InstanceFigures, line_rate_gbps


def on_demand_usd(price_item: str) -> float | None:
    """The hourly USD price in one `pricing:GetProducts` PriceList item (a JSON text whose
    terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD holds it)."""
    terms = json.loads(price_item).get("terms", {}).get("OnDemand", {})
    for term in terms.values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = float(dimension.get("pricePerUnit", {}).get("USD", 0))
            if usd > 0:
                return usd
    return None


def refreshed(instance_type: str, region: str, fact: InstanceFigures) -> tuple[InstanceFigures, str]:
    """The shipped facts with the line rate (ec2:DescribeInstanceTypes) and the us-east-1
    on-demand price (pricing:GetProducts) AWS states now; the shipped ones without credentials."""
    import boto3
    import botocore.exceptions

    today = datetime.date.today().isoformat()
    try:
        described = boto3.client("ec2", region_name=region).describe_instance_types(
            InstanceTypes=[instance_type]
        )["InstanceTypes"][0]
        filters = {
            "instanceType": instance_type,
            "regionCode": "us-east-1",
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        }
        prices = boto3.client("pricing", region_name="us-east-1").get_products(
            ServiceCode="AmazonEC2",
            Filters=[{"Type": "TERM_MATCH", "Field": key, "Value": value} for key, value in filters.items()],
        )["PriceList"]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        return fact, f"shipped facts ({type(err).__name__} from AWS)"
    rate = line_rate_gbps(described["NetworkInfo"]["NetworkPerformance"])
    usd = on_demand_usd(prices[0]) if prices else None
    return (
        dataclasses.replace(
            fact,
            line_rate_gbps=Figure(rate, "ec2:DescribeInstanceTypes", today) if rate else fact.line_rate_gbps,
            usd_per_hour=Figure(usd, "pricing:GetProducts", today) if usd else fact.usd_per_hour,
        ),
        "line rate and price from AWS",
    )
