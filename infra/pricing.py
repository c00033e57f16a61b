"""The prices behind the stack output `training.cost`, read at preview from the AWS Price List.

`aws.pricing.get_product` (pricing:GetProducts) answers one product: a Linux On-Demand instance
type in the stack's region, filtered on every attribute that tells it from the Price List's other
products of the type (`infra.planner.refresh.price_list_filters`: shared tenancy, no pre-installed
software, no license, `capacitystatus` Used, `marketoption` OnDemand; the pulumi-aws data source
fails when its filters match more than one product, as a Capacity Block product of p4d or p5 would
without `marketoption`). The Price List API is served from us-east-1 and ap-south-1 only (the pulumi-aws
data source says it works only with a provider there), so for a stack elsewhere the invoke goes
through a provider pinned to us-east-1 with the stack's identity (`aws:profile` and the role of
`aws:assumeRole`, as the cluster's kubeconfig uses them); `regionCode` still names the stack's region.
When AWS refuses or cannot answer, the price shipped in `infra.planner.figures` is used and named as such.

A Capacity Block's GPU nodes are paid upfront by the block (`infra.planner.cost.capacity_block_price`).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.config.stack import KEEP, StackSettings
from infra.planner.cost import (
    CostBasis,
    Prediction,
    Price,
    StackShape,
    at_rest_usd_per_hour,
    capacity_block_price,
    idle_gpu_cost,
    list_price,
)
from infra.planner.planner import StrategyForecast
from infra.planner.refresh import price_list_filters
from infra.preflight import Placement
from infra.resources.network import NAT_GATEWAYS
from infra.resources.node_groups import GPU_ROOT_VOLUME_GIB, SYSTEM_ROOT_VOLUME_GIB

# Where the pulumi-aws pricing data source works (its docs: "only available in a us-east-1 or
# ap-south-1 provider"), the Price List API's endpoints.
PRICE_LIST_REGIONS = ("us-east-1", "ap-south-1")


def _price_list_provider(settings: StackSettings) -> aws.Provider | None:
    """None where the stack's own provider reaches the Price List; else one pinned to us-east-1."""
    if settings.region in PRICE_LIST_REGIONS:
        return None
    identity = settings.aws_identity
    return aws.Provider(
        "price-list",
        region=PRICE_LIST_REGIONS[0],
        profile=identity.profile,
        assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=identity.role_arn)] if identity.role_arn else None,
    )


def _price(instance_type: str, region: str, provider: aws.Provider | None) -> Price:
    try:
        answer = aws.pricing.get_product(
            service_code="AmazonEC2",
            filters=[
                {"field": field, "value": value}
                for field, value in price_list_filters(instance_type, region).items()
            ],
            opts=pulumi.InvokeOptions(provider=provider),
        )
    except Exception as err:  # refused (no pricing:GetProducts), unreachable, or not one product
        return list_price(instance_type, region, None, " ".join(str(err).split())[:300])
    return list_price(instance_type, region, answer.result, None)


def cost_basis(
    settings: StackSettings, placement: Placement, forecast: StrategyForecast | None, steps: int
) -> CostBasis:
    """The prices, the stack's hourly cost at rest and the planner's prediction, for `training.cost`;
    with `gpuNodesAfterTraining: keep`, one info line of what the GPU nodes cost idle after the run."""
    provider = _price_list_provider(settings)
    system_price = _price(settings.system_node_type, settings.region, provider)
    reservation = placement.reservation
    if reservation is not None and reservation.is_capacity_block:
        gpu_price = capacity_block_price(reservation.reservation_id)
    else:
        gpu_price = _price(settings.gpu_node_type, settings.region, provider)
    if settings.gpu_nodes_after_training == KEEP:
        pulumi.log.info(
            idle_gpu_cost(
                settings.gpu_node_count,
                settings.gpu_node_type,
                gpu_price,
                reservation.reservation_id if reservation else None,
                bool(reservation and reservation.is_capacity_block),
            )
        )
    shape = StackShape(
        version_status=placement.kubernetes_version_status,
        system_nodes=settings.system_node_count,
        system_price=system_price,
        system_root_gib=SYSTEM_ROOT_VOLUME_GIB,
        gpu_nodes=settings.gpu_node_count,
        gpu_price=gpu_price,
        gpu_root_gib=GPU_ROOT_VOLUME_GIB,
        nat_gateways=NAT_GATEWAYS,
    )
    prediction = (
        Prediction(
            steps,
            forecast.step_time_s,
            forecast.tokens_per_s,
            settings.gpu_node_count,
            forecast.inter_node_bytes_per_step,
        )
        if forecast
        else None
    )
    return CostBasis(gpu_price, prediction, at_rest_usd_per_hour(shape))
