"""The planner's instance figures refreshed with the facts AWS states now: the line rate
(ec2:DescribeInstanceTypes) and the us-east-1 On-Demand price (pricing:GetProducts); the shipped
figures without credentials."""

from __future__ import annotations

import dataclasses
import datetime
import json

from infra.planner.figures import Figure, InstanceFigures, line_rate_gbps

# The Price List's attributes of a Linux On-Demand instance (AmazonEC2 products, TERM_MATCH filters of
# pricing:GetProducts; the names and values `pricing:GetAttributeValues` lists): shared tenancy, no
# pre-installed software, no license; `capacitystatus` Used (the Price List also lists each type as
# UnusedCapacityReservation and AllocatedCapacityReservation); `marketoption` OnDemand (it also lists
# Capacity Block products, `marketoption` CapacityBlock with operation `RunInstances:CB`, of p4d,
# p5 and the other types Capacity Blocks offer, under the same attributes otherwise).
ON_DEMAND_LINUX = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "licenseModel": "No License required",
    "capacitystatus": "Used",
    "marketoption": "OnDemand",
}


def price_list_filters(instance_type: str, region: str) -> dict[str, str]:
    """The attributes that name one product, the On-Demand Linux price of `instance_type` in `region`."""
    return {"instanceType": instance_type, "regionCode": region, **ON_DEMAND_LINUX}


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


def refreshed(instance_type: str, region: str, figures: InstanceFigures) -> tuple[InstanceFigures, str]:
    """The shipped figures with the line rate (ec2:DescribeInstanceTypes) and the us-east-1
    on-demand price (pricing:GetProducts) AWS states now; the shipped ones without credentials."""
    import boto3
    import botocore.exceptions

    today = datetime.date.today().isoformat()
    try:
        described = boto3.client("ec2", region_name=region).describe_instance_types(
            InstanceTypes=[instance_type]
        )["InstanceTypes"][0]
        prices = boto3.client("pricing", region_name="us-east-1").get_products(
            ServiceCode="AmazonEC2",
            Filters=[
                {"Type": "TERM_MATCH", "Field": key, "Value": value}
                for key, value in price_list_filters(instance_type, "us-east-1").items()
            ],
        )["PriceList"]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        return figures, f"shipped figures ({type(err).__name__} from AWS)"
    rate = line_rate_gbps(described["NetworkInfo"]["NetworkPerformance"])
    # One product or none: more than one is not a price of this instance type alone.
    usd = on_demand_usd(prices[0]) if len(prices) == 1 else None
    refreshed_figures = dataclasses.replace(
        figures,
        line_rate_gbps=Figure(rate, "ec2:DescribeInstanceTypes", today) if rate else figures.line_rate_gbps,
        usd_per_hour=Figure(usd, "pricing:GetProducts", today) if usd else figures.usd_per_hour,
    )
    if usd:
        return refreshed_figures, "line rate and price from AWS"
    why = (
        f"{len(prices)} products, not one"
        if len(prices) > 1
        else ("no product" if not prices else "a product without an On-Demand price")
    )
    return refreshed_figures, (
        f"line rate from AWS, the shipped price: the Price List answered {why} for On-Demand Linux "
        f"{instance_type} in us-east-1"
    )
