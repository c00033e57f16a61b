"""The communication planner: before anything exists, what a stack's training job costs per step
in inter-node bytes, time, tokens/s and dollars, per sharding strategy.

`python -m infra.planner --stack NAME [--json] [--line-rate-gbps X] [--offline]` forecasts from the
stack file; `pulumi preview` logs the same forecast (`log_forecast`). The judgement (`forecast`) is pure over
figures: the model's size and FLOPs (`training.metrics.flops`), a measured MFU (`infra.planner.figures.MFU_POINTS`),
the instance's line rate, intra-node bandwidth and price (`infra.planner.figures`, refreshed from AWS
when credentials are there, `infra.planner.refresh`). Around it: the forecast as text and at preview
(`infra.planner.report`), the planner against published figures and measurements (`infra.planner.calibration`)
and the command line (`infra.planner.cli`).

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

import dataclasses
import math
from dataclasses import dataclass

from infra.planner.figures import FP8_GPUS, MFU_POINTS, InstanceFigures
from training.config.run_config import CONFIG_DIR, TrainConfig, load_model_config
from training.metrics.flops import flops_per_token, num_params, peak_flops

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
class ClusterShape:
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
class StrategyForecast:
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


def chosen_mfu(workload: Workload) -> tuple[float, str]:
    """The measured MFU of the case nearest the workload, and its label: same activation
    checkpointing, nearest tokens per micro-batch on a log scale."""
    tokens = workload.seq_len * workload.batch_size
    same = [
        point for point in MFU_POINTS if point.activation_checkpointing == workload.activation_checkpointing
    ] or list(MFU_POINTS)
    point = min(same, key=lambda point: abs(math.log(point.tokens_per_micro_batch / tokens)))
    return point.mfu.value, point.label


def ring_share(ranks: int) -> float:
    return (ranks - 1) / ranks


def strategy_forecast(workload: Workload, cluster: ClusterShape, replicas: int) -> StrategyForecast:
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
        volume = ring_share(ranks) * (
            workload.gathers_per_step * gathered + workload.reduces_per_step * reduced
        )
        inter = volume if cluster.nodes > 1 else 0.0
        communication = volume / (min(line, intra) if cluster.nodes > 1 else intra)
        name = "FSDP" if cluster.nodes > 1 or ranks > 1 else "single GPU"
    else:
        shard = cluster.gpus_per_node
        inside = ring_share(shard) * (
            workload.gathers_per_step * gathered + workload.reduces_per_step * reduced
        )
        inter = 2 * ring_share(replicas) * workload.reduces_per_step * reduced
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
    return StrategyForecast(
        name, replicas, inter, compute, communication, step, tokens_per_s, dollars, mfu, source
    )


def forecast(workload: Workload, cluster: ClusterShape) -> list[StrategyForecast]:
    """FSDP, and HSDP when there is more than one node."""
    replicas = [1, cluster.nodes] if cluster.nodes > 1 else [1]
    return [strategy_forecast(workload, cluster, count) for count in replicas]


def configured_replicas(config: TrainConfig, cluster: ClusterShape) -> int:
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


def remedies(workload: Workload, cluster: ClusterShape, replicas: int) -> list[tuple[str, StrategyForecast]]:
    """The changes that raise a network-bound forecast's tokens/s, each with its forecast."""
    current = strategy_forecast(workload, cluster, replicas)
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
    better = [(text, strategy_forecast(changed, cluster, count)) for text, changed, count in candidates]
    return [(text, option) for text, option in better if option.tokens_per_s > current.tokens_per_s]


def cluster_of(
    instance_type: str, nodes: int, figures: InstanceFigures, line_rate: float | None = None
) -> ClusterShape:
    return ClusterShape(
        nodes=nodes,
        gpus_per_node=figures.gpus,
        gpu_name=figures.gpu_name,
        line_rate_gbps=line_rate if line_rate is not None else figures.line_rate_gbps.value,
        intra_node_gbytes_per_s=figures.intra_node_gbytes_per_s.value,
        usd_per_hour=figures.usd_per_hour.value,
    )
