"""What a training run cost and what the stack costs per hour at rest: arithmetic over facts fetched
elsewhere (the GPU nodes' launch times by the TrainingRun, the prices at preview by
`infra.pricing`), so every amount here is a pure function of what it is given.

An estimate from list prices, never the invoice: no discount (Savings Plans, credits), no tax, no
usage-based charge (NAT data processing, S3, CloudWatch, data transfer) is in it.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.aws_rules.reservation_window import parse_aws_time
from infra.config.recorded import read_record
from infra.planner.figures import (
    EC2_BILLING_URL,
    EC2_MINIMUM_BILLED_S,
    EKS_EXTENDED_SUPPORT_USD_PER_HOUR,
    EKS_STANDARD_SUPPORT_USD_PER_HOUR,
    GP3_USD_PER_GB_MONTH,
    HOURS_PER_MONTH,
    NAT_GATEWAY_USD_PER_HOUR,
    PUBLIC_IPV4_USD_PER_HOUR,
    Figure,
    shipped_on_demand_usd,
)
from infra.planner.refresh import on_demand_usd

NOTE = (
    "An estimate from AWS list prices, not the invoice: no discount, credit or tax, and no usage-based "
    "charge (NAT data processing, S3, CloudWatch, data transfer). The AWS Billing console has the bill."
)
EXTENDED_SUPPORT = "EXTENDED_SUPPORT"  # eks:DescribeClusterVersions `versionStatus`


@dataclass(frozen=True)
class Price:
    """An hourly US$ price (None: no hourly price applies or none is known) and where it comes from."""

    usd_per_hour: float | None
    basis: str


def list_price(instance_type: str, region: str, price_item: str | None, refused: str | None) -> Price:
    """The On-Demand price of a Linux instance type: the Price List's item where it answered, else the
    price shipped with the stack, named as such with why the Price List was not used."""
    usd = on_demand_usd(price_item) if price_item else None
    if usd:
        return Price(usd, f"On-Demand list price of {instance_type} in {region}, AWS Price List at preview")
    why = refused or "its answer held no On-Demand price"
    shipped = shipped_on_demand_usd(instance_type)
    if shipped is None:
        return Price(
            None, f"no price for {instance_type}: the Price List was not used ({why}) and none is shipped"
        )
    return Price(
        shipped.value,
        f"On-Demand list price of {instance_type} shipped with the stack (us-east-1, {shipped.source}, read "
        f"{shipped.date}); the Price List was not used: {why}",
    )


def capacity_block_price(reservation_id: str) -> Price:
    """A Capacity Block is paid upfront at purchase, whatever its nodes do, and no EC2 API returns the
    fee of a purchased block (DescribeCapacityBlockOfferings prices offerings; DescribeCapacityBlocks
    and DescribeCapacityReservations carry no fee)."""
    return Price(
        None,
        f"Capacity Block {reservation_id}: its upfront fee, paid at purchase whatever the nodes do; no EC2 API "
        "returns the fee of a purchased block, so no US$ amount is given here (the AWS Billing console has it)",
    )


def idle_gpu_cost(
    count: int, instance_type: str, price: Price, reservation_id: str | None, capacity_block: bool
) -> str:
    """What the GPU nodes cost per hour once the run has its verdict, with `gpuNodesAfterTraining: keep`."""
    release = "gpuNodesAfterTraining: release scales them to 0 after each run"
    if reservation_id is not None:
        held = "is paid up front" if capacity_block else "bills every reserved instance-hour"
        return (
            f"gpuNodesAfterTraining: keep: the {count} GPU nodes stay up after the run, in capacity reservation "
            f"{reservation_id}, which {held} whether they run or not: releasing them would save nothing of it"
        )
    if price.usd_per_hour is None:
        return (
            f"gpuNodesAfterTraining: keep: the {count} {instance_type} GPU nodes stay up after the run and bill "
            f"until `pulumi destroy` ({price.basis}); {release}"
        )
    return (
        f"gpuNodesAfterTraining: keep: the {count} GPU nodes stay up after the run and bill US$ "
        f"{count * price.usd_per_hour:.2f} an hour while idle ({count} x {instance_type} at US$ "
        f"{price.usd_per_hour:g}/h, {price.basis}) until `pulumi destroy`; {release}"
    )


# --- the GPU node hours of a run ---------------------------------------------------------------------


def billed_seconds(launched: datetime.datetime, end: datetime.datetime) -> int:
    """The seconds EC2 bills an On-Demand Linux instance from `launched` to `end`: whole seconds,
    at least 60 once it ran at all (EC2 per-second billing)."""
    seconds = math.ceil((end - launched).total_seconds())
    return max(seconds, EC2_MINIMUM_BILLED_S) if seconds > 0 else 0


def gpu_node_hours(spans: Iterable[tuple[datetime.datetime, datetime.datetime]]) -> float:
    """Node hours of instances each billed from its launch to its end (`instance_end`)."""
    return sum(billed_seconds(launched, end) for launched, end in spans) / 3600


def instance_end(record: Mapping[str, str], end: datetime.datetime) -> datetime.datetime:
    """Where one instance's billed time ends: when it stopped running, if before `end` (the nodes'
    release or the output's time)."""
    stopped = record.get("stoppedAt")
    return min(parse_aws_time(stopped), end) if stopped else end


def tokens_trained(summary: Mapping[str, Any] | None) -> int | None:
    """The tokens the run trained on: the summary's `tokens_seen`; a summary from before that field
    gives its steps times its tokens per step (`tokens_per_s x step_time_s`, the step's own tokens)."""
    summary = summary or {}
    if summary.get("tokens_seen") is not None:
        return int(summary["tokens_seen"])
    steps, rate, step_time = summary.get("steps"), summary.get("tokens_per_s"), summary.get("step_time_s")
    if steps and rate and step_time:
        return int(steps) * round(rate * step_time)
    return None


@dataclass(frozen=True)
class Prediction:
    """The planner's step for the configured strategy (`infra.planner.planner.log_forecast`), and the run's
    size; `bytes_per_step` is what the planner sends through each node's NIC per step, each way."""

    steps: int
    step_time_s: float
    tokens_per_s: float
    nodes: int
    bytes_per_step: float


@dataclass(frozen=True, kw_only=True)
class PredictedRun:
    """What the preview priced and predicted a run at: the GPU nodes' hourly price and its basis, the
    planner's step time and bytes per step (None without a forecast). The TrainingRun takes it as an input
    that does not run it again and keeps it among its outputs from the run on; an unchanged run keeps
    its outputs (the engine's same step: pulumi/pulumi pkg/resource/deploy/step.go, `SameStep.Apply`
    retains the old outputs), so `training.cost.measured` and `forecastVsMeasured`, computed from the run's
    own, stay as the run was billed and forecast whatever later Price Lists and planners say.

    Pulumi hands it back without its None values (a Capacity Block's price is None), so every field
    but the basis defaults to None: a missing key is unknown (`infra.config.recorded`)."""

    price_basis: str
    usd_per_gpu_node_hour: float | None = None
    step_time_s: float | None = None
    bytes_per_step: float | None = None

    @classmethod
    def recorded(cls, value: Mapping[str, Any] | None, output: str) -> PredictedRun | None:
        """As the TrainingRun's output holds it, read for the stack output `output`; None for a run
        that recorded none."""
        return read_record(cls, value, output)


@dataclass(frozen=True)
class CostBasis:
    """What preview knows of the cost: the GPU nodes' price, the planner's prediction (None without
    a forecast) and the stack's hourly cost at rest (`at_rest_usd_per_hour`)."""

    gpu_price: Price
    prediction: Prediction | None
    at_rest: Mapping[str, Any]

    @property
    def predicted_run(self) -> PredictedRun:
        """The price and the prediction, for the TrainingRun to record with the run."""
        prediction = self.prediction
        return PredictedRun(
            price_basis=self.gpu_price.basis,
            usd_per_gpu_node_hour=self.gpu_price.usd_per_hour,
            step_time_s=prediction.step_time_s if prediction else None,
            bytes_per_step=prediction.bytes_per_step if prediction else None,
        )


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def predicted_cost(basis: CostBasis) -> dict[str, Any]:
    """What `training.cost` knows at preview: the price and its basis, the planner's prediction at that
    price (the steps' time alone, `steps x step time x nodes x price`), the stack per hour at rest."""
    price, prediction = basis.gpu_price, basis.prediction
    predicted_usd = predicted_per_mtoken = None
    if prediction is not None and price.usd_per_hour is not None:
        fleet_per_s = prediction.nodes * price.usd_per_hour / 3600
        predicted_usd = prediction.steps * prediction.step_time_s * fleet_per_s
        predicted_per_mtoken = fleet_per_s / prediction.tokens_per_s * 1e6
    return {
        "usdPerGpuNodeHour": price.usd_per_hour,
        "priceBasis": price.basis,
        "predictedUsd": _rounded(predicted_usd, 2),
        "predictedUsdPerMillionTokens": _rounded(predicted_per_mtoken, 2),
        "atRestUsdPerHour": dict(basis.at_rest),
        "billing": f"EC2 bills per second while running, 60 s at least ({EC2_BILLING_URL})",
        "note": NOTE,
    }


# The basis `measured_cost` gives a run that recorded no price.
UNRECORDED_PRICE = "no price was recorded with this run; the next run records the price it is billed at"


def measured_cost(
    recorded: PredictedRun | None,
    gpu_nodes: Mapping[str, Mapping[str, str]] | None,
    gpu_nodes_unavailable: str | None,
    finished_at: str | None,
    summary: Mapping[str, Any] | None,
    released_at: str | None = None,
    tcp_summary: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the run cost, `training.cost.measured`, at the price recorded with it (`recorded`, the
    TrainingRun's `planned`; None: it recorded none, and the US$ amounts are None). `gpu_nodes` are the
    TrainingRun's (node -> its instance: `instanceId`, `launchTime`, `stoppedAt` for one that stopped
    running, `unavailable` for one that cannot be counted:
    `workloads.training_run.access.ec2_instances.instance_record`); the hours run from each launch to
    its stop, or to `released_at` (when the GPU nodes were released), or else to `finished_at` (the
    output's time); those not counted are named in `notCounted`. Without any launch time (before the
    first run, or when EC2 refused DescribeInstances) the hours and US$ are None and `unavailable`
    says why. `tcp_summary` (with `benchmark`): the TCP baseline's summary, whose tokens the
    per-token cost counts beside the job's, as the nodes' hours hold its run too."""
    end_text = released_at or finished_at
    hours: float | None = None
    reason = gpu_nodes_unavailable
    records = (gpu_nodes or {}).items()
    counted = [record for _, record in records if "launchTime" in record and "unavailable" not in record]
    # A record without its instance id (none of this release's) is named by its node.
    not_counted = {
        record.get("instanceId", node): record["unavailable"]
        for node, record in records
        if "unavailable" in record
    }
    if counted and end_text and not reason:
        end = parse_aws_time(end_text)
        hours = gpu_node_hours(
            (parse_aws_time(record["launchTime"]), instance_end(record, end)) for record in counted
        )
    elif reason is None:
        reason = (
            "no GPU node's instance could be counted: "
            + "; ".join(f"{i}: {why}" for i, why in not_counted.items())
            if not_counted
            else "no training run has reported its GPU nodes yet"
        )
    price = recorded.usd_per_gpu_node_hour if recorded else None
    usd = hours * price if hours is not None and price is not None else None
    tokens = tokens_trained(summary)
    baseline = tokens_trained(tcp_summary)
    if tcp_summary is None:
        trained = tokens
        covers = "the GPU nodes' whole time (their start, the gate, the job) over the job's tokens"
    else:
        trained = tokens + baseline if tokens is not None and baseline is not None else None
        covers = (
            "the GPU nodes' whole time (their start, both gates, the job and the TCP baseline) over the "
            "tokens of both jobs"
        )
    return {
        "usdPerGpuNodeHour": price,
        "priceBasis": recorded.price_basis if recorded else UNRECORDED_PRICE,
        "gpuNodeHours": _rounded(hours),
        "from": "each GPU node's EC2 launch time",
        "to": ("the GPU nodes' release" if released_at else "the output's time") if end_text else None,
        "endedAt": end_text,
        "unavailable": reason if hours is None else None,
        "notCounted": not_counted or None,
        "usd": _rounded(usd, 2),
        "tokens": tokens,
        "tcpBaselineTokens": baseline,
        "usdPerMillionTokens": _rounded(usd / trained * 1e6, 2) if usd is not None and trained else None,
        "usdPerMillionTokensOf": covers,
    }


# --- the stack at rest ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackShape:
    """What bills by the hour whatever the GPUs do, and the GPU nodes beside it."""

    version_status: str | None  # eks:DescribeClusterVersions' status of kubernetesVersion; None: not read
    system_nodes: int
    system_price: Price
    system_root_gib: int
    gpu_nodes: int
    gpu_price: Price
    gpu_root_gib: int
    nat_gateways: int


def _per_hour(figure: Figure, count: float = 1) -> float:
    return count * figure.value


def _sum(parts: Sequence[float | None]) -> float | None:
    """The total, or None when a part is unknown."""
    values = [value for value in parts if value is not None]
    return None if len(values) < len(parts) else round(sum(values), 4)


def at_rest_usd_per_hour(shape: StackShape) -> dict[str, Any]:
    """US$ per hour of the stack with the GPU nodes at 0 and with them running, and each part."""
    extended = shape.version_status == EXTENDED_SUPPORT
    control = EKS_EXTENDED_SUPPORT_USD_PER_HOUR if extended else EKS_STANDARD_SUPPORT_USD_PER_HOUR
    gp3_per_gib_hour = GP3_USD_PER_GB_MONTH.value / HOURS_PER_MONTH
    system = shape.system_price.usd_per_hour
    gpu = shape.gpu_price.usd_per_hour
    parts = {
        "controlPlane": control.value,
        "systemNodes": None if system is None else round(shape.system_nodes * system, 4),
        "natGateways": round(
            _per_hour(NAT_GATEWAY_USD_PER_HOUR, shape.nat_gateways)
            + _per_hour(PUBLIC_IPV4_USD_PER_HOUR, shape.nat_gateways),
            4,
        ),
        "systemVolumes": round(shape.system_nodes * shape.system_root_gib * gp3_per_gib_hour, 4),
        "gpuNodes": None if gpu is None else round(shape.gpu_nodes * gpu, 4),
        "gpuVolumes": round(shape.gpu_nodes * shape.gpu_root_gib * gp3_per_gib_hour, 4),
    }
    at_zero = ("controlPlane", "systemNodes", "natGateways", "systemVolumes")
    support = {
        None: "standard (the version's status was not read)",
        EXTENDED_SUPPORT: "extended",
    }.get(shape.version_status, "standard")
    return {
        "gpuNodesAtZero": _sum([parts[key] for key in at_zero]),
        "gpuNodesRunning": _sum(list(parts.values())),
        "parts": parts,
        "controlPlaneSupport": support,
        "systemNodeBasis": shape.system_price.basis,
        "sources": {
            "controlPlane": f"{control.source} (read {control.date})",
            "natGateways": f"{NAT_GATEWAY_USD_PER_HOUR.source}, gateway and its public IPv4 address (read "
            f"{NAT_GATEWAY_USD_PER_HOUR.date})",
            "volumes": f"{GP3_USD_PER_GB_MONTH.source}, gp3 per GB-month over {HOURS_PER_MONTH} h (read "
            f"{GP3_USD_PER_GB_MONTH.date})",
        },
    }
