"""The communication planner: before anything exists, what a stack's training job costs per step
in inter-node bytes, time, tokens/s and dollars, per sharding strategy.

`python -m infra.plan --stack NAME [--json] [--line-rate-gbps X] [--offline]` plans from the
stack file; `pulumi preview` logs the same plan (`log_plan`). The judgement (`plan`) is pure over
facts: the model's size and FLOPs (`training.metrics.flops`), a measured MFU read from `bench/results/`,
the instance's line rate, intra-node bandwidth and price (`infra.plan.facts`, refreshed from AWS
when credentials are there).

The model, per optimizer step and per rank:
- FSDP over all N ranks: bf16 all-gathers (forward, and backward when layers reshard after the
  forward) and an fp32 reduce-scatter. A ring crosses each node's NIC once per direction, so each
  collective of S bytes puts (N-1)/N * S through every NIC each way.
- HSDP (one replica per node): the gathers and reduce-scatters stay inside the node; only the
  all-reduce of each rank's fp32 gradient shard crosses, 2(R-1)/R * P * 4 bytes per NIC each way.
- Compute: the step's FLOPs at the GPU's bf16 peak times the measured MFU of the nearest case.
- Overlap: FSDP prefetches the next layer's collective behind the current layer's compute, so all
  but one unit's share of the communication hides behind compute: step = max(compute,
  comm - comm/units) + comm/units, units = layers + 1 (each layer and the root).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra.plan.facts import (
    AWS_SAMPLE_BATCH,
    AWS_SAMPLE_EFA_STEPS_PER_S,
    AWS_SAMPLE_INSTANCE,
    AWS_SAMPLE_NODES,
    AWS_SAMPLE_SEQ_LEN,
    AWS_SAMPLE_TCP_STEPS_PER_S,
    FP8_GPUS,
    INSTANCES,
    MFU_POINTS,
    NCCL_TESTS,
    Fact,
    InstanceFact,
    line_rate_gbps,
)
from training.config.run_config import CONFIG_DIR, TrainConfig, load_model_config
from training.metrics.flops import flops_per_token, num_params, peak_flops

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9
# The job's FSDP2 policy (training/distributed/parallelize.py MIXED_PRECISION): bf16 parameters gathered,
# gradients reduced in fp32. A test checks these against the policy.
PARAM_BYTES = 2
REDUCE_BYTES = 4


@dataclass(frozen=True)
class Workload:
    """One rank's share of a training step, as the planner needs it."""

    params: int
    flops_per_token: float
    layers: int
    seq_len: int
    batch_size: int
    grad_accum_steps: int
    defer_grad_sync: bool
    reshard_after_forward: bool
    activation_checkpointing: bool
    param_bytes: int = PARAM_BYTES
    reduce_bytes: int = REDUCE_BYTES
    float8_all_gather: bool = False

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size * self.grad_accum_steps

    @property
    def gathers_per_step(self) -> int:
        """Forward gathers, and backward ones when layers reshard after the forward; deferring the
        reduce keeps layers gathered from one backward into the next forward."""
        if self.defer_grad_sync:
            return 1 + self.grad_accum_steps * int(self.reshard_after_forward)
        return self.grad_accum_steps * (1 + int(self.reshard_after_forward))

    @property
    def reduces_per_step(self) -> int:
        return 1 if self.defer_grad_sync else self.grad_accum_steps


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_name: str
    line_rate_gbps: float
    intra_node_gbytes_per_s: float
    usd_per_hour: float

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class StrategyPlan:
    name: str
    replicas: int
    inter_node_bytes_per_step: float  # through each node's NIC, each direction
    compute_s: float
    communication_s: float
    step_time_s: float
    tokens_per_s: float
    usd_per_million_tokens: float
    mfu: float
    mfu_source: str

    @property
    def network_bound(self) -> bool:
        return self.communication_s > self.compute_s


@cache
def _record(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((ROOT / path).read_text())
    return loaded


def measured_mfu(path: str, section: str, case: str) -> tuple[float, int, bool]:
    """(MFU, tokens per micro-batch, activation checkpointing) of one benchmark case, by the
    `6·N + 12·L·H·S` FLOPs over its GPU's bf16 peak (the record's own `mfu` where it has one)."""
    record = _record(path)
    row = next(row for row in record[section] if row["name"] == case)
    tokens = row["seq_len"] * row["batch_size"]
    if "mfu" in row:
        mfu = float(row["mfu"])
    else:
        model = load_model_config(record["model_config"])
        peak = peak_flops(record["gpu_name"])
        assert peak is not None, f"{path}: no bf16 peak for {record['gpu_name']}"
        mfu = row["tokens_per_s_per_gpu"] * flops_per_token(model, row["seq_len"]) / peak
    return mfu, tokens, bool(row.get("activation_checkpointing", False))


def chosen_mfu(workload: Workload) -> tuple[float, str]:
    """The measured MFU of the case nearest the workload: same activation checkpointing, nearest
    tokens per micro-batch on a log scale."""
    tokens = workload.seq_len * workload.batch_size
    points = [(measured_mfu(*point), point) for point in MFU_POINTS]
    same = [entry for entry in points if entry[0][2] == workload.activation_checkpointing] or points
    (mfu, _, _), point = min(same, key=lambda entry: abs(math.log(entry[0][1] / tokens)))
    return mfu, f"{point[0]} {point[2]}"


def _ring(ranks: int) -> float:
    return (ranks - 1) / ranks


def strategy_plan(workload: Workload, cluster: Cluster, replicas: int) -> StrategyPlan:
    """One strategy's step: `replicas` 1 is FSDP over every rank, `replicas` = nodes is HSDP with
    the shards inside a node."""
    if replicas not in (1, cluster.nodes):
        raise ValueError(f"replicas {replicas}: the planner knows FSDP (1) and one replica per node")
    gathered = workload.params * (1 if workload.float8_all_gather else workload.param_bytes)
    reduced = workload.params * workload.reduce_bytes
    line = cluster.line_rate_gbps * GB / 8
    intra = cluster.intra_node_gbytes_per_s * GB
    ranks = cluster.ranks
    if replicas == 1:
        volume = _ring(ranks) * (workload.gathers_per_step * gathered + workload.reduces_per_step * reduced)
        inter = volume if cluster.nodes > 1 else 0.0
        communication = volume / (min(line, intra) if cluster.nodes > 1 else intra)
        name = "FSDP" if cluster.nodes > 1 or ranks > 1 else "single GPU"
    else:
        shard = cluster.gpus_per_node
        inside = _ring(shard) * (workload.gathers_per_step * gathered + workload.reduces_per_step * reduced)
        inter = 2 * _ring(replicas) * workload.reduces_per_step * reduced
        communication = inside / intra + inter / line
        name = f"HSDP {replicas}x{shard}"
    mfu, source = chosen_mfu(workload)
    peak = peak_flops(cluster.gpu_name)
    if peak is None:
        raise ValueError(f"no bf16 peak known for {cluster.gpu_name}")
    compute = workload.tokens_per_step * workload.flops_per_token / (peak * mfu)
    exposed = communication / (workload.layers + 1)
    step = max(compute, communication - exposed) + exposed
    tokens_per_s = ranks * workload.tokens_per_step / step
    dollars = cluster.nodes * cluster.usd_per_hour / 3600 / tokens_per_s * 1e6
    return StrategyPlan(
        name, replicas, inter, compute, communication, step, tokens_per_s, dollars, mfu, source
    )


def plan(workload: Workload, cluster: Cluster) -> list[StrategyPlan]:
    """FSDP, and HSDP when there is more than one node."""
    replicas = [1, cluster.nodes] if cluster.nodes > 1 else [1]
    return [strategy_plan(workload, cluster, count) for count in replicas]


def configured_replicas(config: TrainConfig, cluster: Cluster) -> int:
    """The job's `--hsdp-replicas`, 0 meaning one replica per node (training/distributed/parallelize.py)."""
    return config.hsdp_replicas or cluster.nodes


def workload_of(config: TrainConfig) -> Workload | None:
    """The planner's view of a job; None for a model config the repository does not ship."""
    if not (CONFIG_DIR / f"{config.model_config}.json").is_file():
        return None
    model = load_model_config(config.model_config)
    return Workload(
        params=num_params(model),
        flops_per_token=flops_per_token(model, config.seq_len),
        layers=int(model["num_hidden_layers"]),
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        grad_accum_steps=config.grad_accum_steps,
        defer_grad_sync=config.defer_grad_sync,
        reshard_after_forward=config.reshard_after_forward,
        activation_checkpointing=config.activation_checkpointing,
    )


def remedies(workload: Workload, cluster: Cluster, replicas: int) -> list[tuple[str, StrategyPlan]]:
    """The changes that raise a network-bound plan's tokens/s, each with its plan."""
    current = strategy_plan(workload, cluster, replicas)
    accumulated = max(4, 2 * workload.grad_accum_steps)
    candidates = []
    if replicas == 1 and cluster.nodes > 1:
        candidates.append(("HSDP (training.hsdpReplicas: auto)", workload, cluster.nodes))
    candidates.append(
        (
            f"more tokens per step: training.gradAccumSteps: {accumulated} with deferGradSync: true",
            dataclasses.replace(workload, grad_accum_steps=accumulated, defer_grad_sync=True),
            replicas,
        )
    )
    if any(name in cluster.gpu_name for name in FP8_GPUS):
        candidates.append(
            (
                "float8 all-gather (torchao's enable_fsdp_float8_all_gather; not a flag of the job yet)",
                dataclasses.replace(workload, float8_all_gather=True),
                replicas,
            )
        )
    better = [(text, strategy_plan(changed, cluster, count)) for text, changed, count in candidates]
    return [(text, option) for text, option in better if option.tokens_per_s > current.tokens_per_s]


# --- facts: shipped, or refreshed from AWS ---------------------------------------------------------


def cluster_of(instance_type: str, nodes: int, fact: InstanceFact, line_rate: float | None = None) -> Cluster:
    return Cluster(
        nodes=nodes,
        gpus_per_node=fact.gpus,
        gpu_name=fact.gpu_name,
        line_rate_gbps=line_rate if line_rate is not None else fact.line_rate_gbps.value,
        intra_node_gbytes_per_s=fact.intra_node_gbytes_per_s.value,
        usd_per_hour=fact.usd_per_hour.value,
    )


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


def refreshed(instance_type: str, region: str, fact: InstanceFact) -> tuple[InstanceFact, str]:
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
            line_rate_gbps=Fact(rate, "ec2:DescribeInstanceTypes", today) if rate else fact.line_rate_gbps,
            usd_per_hour=Fact(usd, "pricing:GetProducts", today) if usd else fact.usd_per_hour,
        ),
        "line rate and price from AWS",
    )


# --- formatting --------------------------------------------------------------------------------


def plan_rows(plans: Sequence[StrategyPlan]) -> list[dict[str, Any]]:
    return [
        {
            "name": row.name,
            "inter_node_bytes_per_step": row.inter_node_bytes_per_step,
            "step_time_s": row.step_time_s,
            "tokens_per_s": row.tokens_per_s,
            "usd_per_million_tokens": row.usd_per_million_tokens,
            "compute_s": row.compute_s,
            "communication_s": row.communication_s,
            "network_bound": row.network_bound,
        }
        for row in plans
    ]


def mfu_basis(plan: StrategyPlan, gpu_name: str) -> str:
    """Where the plan's MFU comes from: the benchmark case, and, when that ran on another GPU, that
    the plan takes the same share of this GPU's peak (MFU_POINTS ran on synthetic tokens)."""
    path = plan.mfu_source.split(" ", 1)[0]
    measured_on = _record(path).get("gpu_name")
    text = f"MFU {plan.mfu:.1%} from {plan.mfu_source}"
    if measured_on and measured_on != gpu_name:
        text += (
            f", measured on one {measured_on} on causal rows and taken as the same share of the "
            f"{gpu_name}'s bf16 peak, not measured on it"
        )
    return text


def plan_table(plans: Sequence[StrategyPlan], cluster: Cluster, chosen: int | None) -> str:
    lines = [
        f"plan for {cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu_name} at {cluster.line_rate_gbps:g} Gbps "
        f"({mfu_basis(plans[0], cluster.gpu_name)}):",
        "  strategy     inter-node GB/step  compute s  comm s  step s  tokens/s  $/M tokens",
    ]
    for row in plans:
        mark = "*" if row.replicas == chosen else " "
        lines.append(
            f" {mark}{row.name:<12} {row.inter_node_bytes_per_step / GB:>18.2f} {row.compute_s:>10.3f} "
            f"{row.communication_s:>7.3f} {row.step_time_s:>7.3f} {row.tokens_per_s:>9,.0f} "
            f"{row.usd_per_million_tokens:>11.3f}"
        )
    return "\n".join(lines)


def network_warning(workload: Workload, cluster: Cluster, replicas: int) -> str | None:
    """What to change when the configured strategy's communication outlasts its compute."""
    current = strategy_plan(workload, cluster, replicas)
    if not current.network_bound:
        return None
    options = "; ".join(
        f"{text} -> {option.tokens_per_s:,.0f} tokens/s"
        for text, option in remedies(workload, cluster, replicas)
    )
    return (
        f"the training job is predicted network-bound on {cluster.nodes} x {cluster.gpus_per_node} "
        f"{cluster.gpu_name}: {current.communication_s:.2f} s of communication against {current.compute_s:.2f} s "
        f"of compute per step ({current.tokens_per_s:,.0f} tokens/s with {current.name})"
        + (f"; predicted to help: {options}" if options else "")
    )


def log_plan(
    config: TrainConfig, instance_type: str, nodes: int, network_performance: str
) -> StrategyPlan | None:
    """At preview: the plan of the stack's job as an info line, and a warning when the configured
    strategy is network-bound. The line rate is the one AWS states for the type (`network_performance`),
    the other facts the shipped ones; nothing is said for a type or model without facts. Returns the
    configured strategy's plan, whose predictions the stack exports beside the measured figures."""
    import pulumi

    fact = INSTANCES.get(instance_type)
    workload = workload_of(config)
    if fact is None or workload is None:
        pulumi.log.info(
            f"no communication plan: the planner has no facts for {instance_type} or {config.model_config}"
        )
        return None
    cluster = cluster_of(instance_type, nodes, fact, line_rate_gbps(network_performance))
    chosen = configured_replicas(config, cluster)
    plans = plan(workload, cluster)
    configured = [row for row in plans if row.replicas == chosen]
    duration = (
        f"\n  predicted run: {config.steps} steps x {configured[0].step_time_s:.2f} s = "
        f"{config.steps * configured[0].step_time_s / 60:.1f} min with {configured[0].name}"
        if configured
        else ""
    )
    pulumi.log.info(plan_table(plans, cluster, chosen) + duration)
    warning = network_warning(workload, cluster, chosen) if chosen in (1, cluster.nodes) else None
    if warning:
        pulumi.log.warn(warning)
    return configured[0] if configured else None


def measured_against_plan(
    predicted: StrategyPlan | None, summary: Mapping[str, Any] | None
) -> dict[str, Any]:
    """After a run: the planner's step time and inter-node bytes per step beside the run's, and
    measured / predicted. The run's bytes are its summary's `efa_bytes_per_step` (sent plus
    received through each node's EFA ports, `training.metrics.efa_meter`), halved into the one direction
    the planner counts (FSDP's ring collectives send what they receive) and averaged over the
    nodes; None where either side has no figure."""
    summary = summary or {}
    step_time = summary.get("step_time_s")
    per_node = [value for value in (summary.get("efa_bytes_per_step") or {}).values() if value is not None]
    measured_bytes = sum(per_node) / len(per_node) / 2 if per_node else None
    predicted_step = predicted.step_time_s if predicted else None
    predicted_bytes = predicted.inter_node_bytes_per_step if predicted else None

    def ratio(measured: float | None, planned: float | None) -> float | None:
        return round(measured / planned, 3) if measured is not None and planned else None

    return {
        "predictedStepTimeS": predicted_step,
        "measuredStepTimeS": step_time,
        "stepTimeRatio": ratio(step_time, predicted_step),
        "predictedBytesPerStep": predicted_bytes,
        "measuredBytesPerStep": measured_bytes,
        "bytesPerStepRatio": ratio(measured_bytes, predicted_bytes),
    }


# --- the planner against published and measured figures (docs/benchmarks.md) --------------------

COMPUTE_RECORD = "bench/results/h200-throughput.json"
QWEN = "qwen2.5-1.5b"


def _qwen_workload(seq_len: int, batch_size: int, **changes: Any) -> Workload:
    model = load_model_config(QWEN)
    base = Workload(
        params=num_params(model),
        flops_per_token=flops_per_token(model, seq_len),
        layers=int(model["num_hidden_layers"]),
        seq_len=seq_len,
        batch_size=batch_size,
        grad_accum_steps=1,
        defer_grad_sync=False,
        reshard_after_forward=True,
        activation_checkpointing=False,
    )
    return dataclasses.replace(base, **changes)


def all_reduce_seconds(size_bytes: int, cluster: Cluster) -> float:
    """A ring all-reduce over every rank: 2(N-1)/N of the buffer through the slowest link."""
    line = cluster.line_rate_gbps * GB / 8
    intra = cluster.intra_node_gbytes_per_s * GB
    return 2 * _ring(cluster.ranks) * size_bytes / (min(line, intra) if cluster.nodes > 1 else intra)


def aws_sample_plan(line_rate: float | None = None) -> StrategyPlan:
    """AWS's sample job: bf16 weights without mixed precision, so gradients reduce in bf16."""
    cluster = cluster_of(AWS_SAMPLE_INSTANCE, AWS_SAMPLE_NODES, INSTANCES[AWS_SAMPLE_INSTANCE], line_rate)
    workload = _qwen_workload(AWS_SAMPLE_SEQ_LEN, AWS_SAMPLE_BATCH, reduce_bytes=PARAM_BYTES)
    return strategy_plan(workload, cluster, 1)


def implied_line_rate(steps_per_s: float) -> float:
    """The line rate at which the planner reproduces the sample's steps/s (bisection; the planned
    rate rises with the line rate)."""
    low, high = 0.01, 10_000.0
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if 1 / aws_sample_plan(middle).step_time_s < steps_per_s else (low, middle)
    return low


def comparison_rows() -> list[list[str]]:
    """What the planner predicts against each measured or published figure, with its error."""
    rows = []
    h200 = Cluster(1, 1, "NVIDIA H200", 0.0, 1.0, 0.0)
    for case in _record(COMPUTE_RECORD)["variants"]:
        if case["seq_len"] != 4096 or not case["name"].startswith("tuned-compiled"):
            continue
        workload = _qwen_workload(
            4096,
            case["batch_size"],
            grad_accum_steps=case.get("grad_accum_steps", 1),
            defer_grad_sync=case.get("defer_grad_sync", False),
        )
        predicted = strategy_plan(workload, h200, 1)
        calibration = " (the MFU point)" if predicted.mfu_source.endswith(case["name"]) else ""
        rows.append(
            [
                f"compute: 1 x H200, `{case['name']}`{calibration}",
                "tokens/s",
                f"{case['tokens_per_s']:,.0f}",
                f"{predicted.tokens_per_s:,.0f}",
                f"{predicted.tokens_per_s / case['tokens_per_s'] - 1:+.1%}",
            ]
        )
    efa = aws_sample_plan()
    line_rate = INSTANCES[AWS_SAMPLE_INSTANCE].line_rate_gbps.value
    for label, figure in (("EFA", AWS_SAMPLE_EFA_STEPS_PER_S), ("TCP", AWS_SAMPLE_TCP_STEPS_PER_S)):
        predicted_rate = 1 / efa.step_time_s
        rows.append(
            [
                f"network: AWS's sample over {label}, 2 x g6.12xlarge, seq 128 x 1, FSDP "
                f"(at the {line_rate:g} Gbps line rate; {implied_line_rate(figure.value):.1f} Gbps reproduces it)",
                "steps/s",
                f"{figure.value:.4f}",
                f"{predicted_rate:.4f}",
                f"{predicted_rate / figure.value - 1:+.1%}",
            ]
        )
    for published in NCCL_TESTS:
        fact = INSTANCES[published.instance_type]
        cluster = cluster_of(published.instance_type, published.nodes, fact)
        seconds = all_reduce_seconds(published.size_bytes, cluster)
        rows.append(
            [
                f"network: nccl-tests all_reduce_perf, {published.nodes} x {published.instance_type}, "
                f"{published.size_bytes / 2**30:g} GiB fp32",
                "time (us)",
                f"{published.time_us.value:,.0f}",
                f"{seconds * 1e6:,.0f}",
                f"{seconds * 1e6 / published.time_us.value - 1:+.1%}",
            ]
        )
    return rows


def comparison_table() -> str:
    header = ["figure", "unit", "measured", "planner", "error"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in comparison_rows())])


# --- command line ------------------------------------------------------------------------------


def stack_values(stack: str) -> tuple[dict[str, Any], str | None]:
    """The project's keys of `Pulumi.<stack>.yaml` (objects as JSON text, as the engine passes
    them) and its `aws:region`."""
    path = ROOT / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml")))
        raise SystemExit(f"--stack {stack}: no Pulumi.{stack}.yaml; stacks here: {names}")
    config = yaml.safe_load(path.read_text()).get("config", {})
    from platform_facts import PROJECT

    prefix = f"{PROJECT}:"
    values = {
        key[len(prefix) :]: value if isinstance(value, str) else json.dumps(value)
        for key, value in config.items()
        if key.startswith(prefix)
    }
    return values, config.get("aws:region")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack whose Pulumi.<stack>.yaml to plan")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--line-rate-gbps", type=float, help="override the line rate (e.g. to plan TCP)")
    parser.add_argument("--offline", action="store_true", help="use the shipped facts without asking AWS")
    args = parser.parse_args(argv)
    if args.line_rate_gbps is not None and not args.line_rate_gbps > 0:
        parser.error("--line-rate-gbps: expected a positive number of Gbps")

    from infra.config.parsing import ConfigError, validated
    from infra.config.stack import StackKeys
    from infra.config.training_settings import training_config

    values, region = stack_values(args.stack)
    try:
        keys = validated(
            StackKeys, {k: values[k] for k in ("gpuNodeType", "gpuNodeCount", "training") if k in values}
        )
    except ConfigError as err:
        raise SystemExit(f"Pulumi.{args.stack}.yaml: {err}") from None
    fact = INSTANCES.get(keys.gpu_node_type)
    if fact is None:
        raise SystemExit(
            f"config key 'gpuNodeType' = {keys.gpu_node_type!r}: the planner has facts for "
            f"{', '.join(INSTANCES)} only (infra/plan/facts.py)"
        )
    source = "shipped facts (--offline)"
    if not args.offline:
        fact, source = refreshed(keys.gpu_node_type, region or "us-east-1", fact)
    world = keys.gpu_node_count * fact.gpus
    flags = list(keys.training.flags)
    config = training_config(
        [*flags, "--use-gpu", *([] if "--workers" in flags else ["--workers", str(world)])]
    )
    workload = workload_of(config)
    if workload is None:
        raise SystemExit(f"training model config {config.model_config!r} is not shipped: nothing to plan")
    cluster = cluster_of(keys.gpu_node_type, keys.gpu_node_count, fact, args.line_rate_gbps)
    plans = plan(workload, cluster)
    chosen = configured_replicas(config, cluster)
    if args.json:
        print(json.dumps({"line_rate_gbps": cluster.line_rate_gbps, "strategies": plan_rows(plans)}))
        return 0
    print(
        f"{args.stack}: preset {config.preset}, seq {config.seq_len} x batch {config.batch_size} x "
        f"{config.grad_accum_steps} micro-batches, {keys.gpu_node_type} ({source})"
    )
    print(plan_table(plans, cluster, chosen))
    if chosen in (1, cluster.nodes):
        warning = network_warning(workload, cluster, chosen)
        if warning:
            print(f"warning: {warning}")
    return 0
