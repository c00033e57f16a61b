"""The figures the communication planner and the cost figures (`infra.planner`) work from offline, each
with its source and the date it was read. AWS's own answers replace the line rates and prices when
credentials are there (`infra.planner.refresh.refreshed`, and the Price List at preview for the stack's
cost); the published figures are what `docs/benchmarks.md` checks the planner against. The measured
figures cite their report page and are declared here: the product never reads the
benchmark record, and a test keeps each equal to its report's raw JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

READ_ON = "2026-12-04"
INSTANCE_TYPES_URL = "https://aws.amazon.com/ec2/instance-types/"
ON_DEMAND_PRICES_URL = "https://aws.amazon.com/ec2/pricing/on-demand/"  # us-east-1, Linux, shared tenancy


@dataclass(frozen=True)
class Figure:
    """A number, where it was published, and when it was read there."""

    value: float
    source: str
    date: str


@dataclass(frozen=True)
class InstanceFigures:
    """What the planner needs of an instance type: its GPUs, its links and its price."""

    gpus: int
    gpu_name: str  # as `training.metrics.flops.peak_flops` reads it
    # The node's network line rate (DescribeInstanceTypes `NetworkPerformance`), each direction.
    line_rate_gbps: Figure
    # GPU-to-GPU bandwidth inside the node, each direction: PCIe when the GPUs have no NVLink.
    intra_node_gbytes_per_s: Figure
    usd_per_hour: Figure
    gpudirect_rdma: bool


INSTANCES: dict[str, InstanceFigures] = {
    # 4 x L4 on PCIe Gen4 x16 (no NVLink, no GPUDirect RDMA), 1 EFA on a 40 Gbps link.
    "g6.12xlarge": InstanceFigures(
        gpus=4,
        gpu_name="NVIDIA L4",
        line_rate_gbps=Figure(40, "https://aws.amazon.com/ec2/instance-types/g6/", READ_ON),
        intra_node_gbytes_per_s=Figure(
            32, "https://www.nvidia.com/en-us/data-center/l4/ (PCIe Gen4 x16, 64 GB/s both ways)", READ_ON
        ),
        usd_per_hour=Figure(4.6016, ON_DEMAND_PRICES_URL, READ_ON),
        gpudirect_rdma=False,
    ),
    # The p4d and p5 prices are those after AWS's June 2025 cut of P4/P5 on-demand prices, not re-read
    # from the price list here; `python -m infra.planner` replaces them with pricing:GetProducts' answer.
    # 8 x A100 40GB on NVSwitch, 4 EFA (4 x 100 Gbps), GPUDirect RDMA.
    "p4d.24xlarge": InstanceFigures(
        gpus=8,
        gpu_name="NVIDIA A100",
        line_rate_gbps=Figure(400, "https://aws.amazon.com/ec2/instance-types/p4/", READ_ON),
        intra_node_gbytes_per_s=Figure(
            300, "https://www.nvidia.com/en-us/data-center/a100/ (NVLink 600 GB/s both ways)", READ_ON
        ),
        usd_per_hour=Figure(21.96, ON_DEMAND_PRICES_URL, READ_ON),
        gpudirect_rdma=True,
    ),
    # 8 x H100 on NVSwitch, 32 EFA (3200 Gbps), GPUDirect RDMA.
    "p5.48xlarge": InstanceFigures(
        gpus=8,
        gpu_name="NVIDIA H100",
        line_rate_gbps=Figure(3200, "https://aws.amazon.com/ec2/instance-types/p5/", READ_ON),
        intra_node_gbytes_per_s=Figure(
            450, "https://www.nvidia.com/en-us/data-center/h100/ (NVLink 900 GB/s both ways)", READ_ON
        ),
        usd_per_hour=Figure(55.04, ON_DEMAND_PRICES_URL, READ_ON),
        gpudirect_rdma=True,
    ),
}

# --- what the rest of the stack costs per hour, whatever the GPUs do (us-east-1 list prices; us-east-2's
# are the same for each of these) ----------------------------------------------------------------
EKS_PRICING_URL = "https://aws.amazon.com/eks/pricing/"
VPC_PRICING_URL = "https://aws.amazon.com/vpc/pricing/"
EBS_PRICING_URL = "https://aws.amazon.com/ebs/pricing/"
# The control plane per cluster-hour: standard support, and a Kubernetes version in extended support
# (US$ 0.60 in all, since April 2024).
EKS_STANDARD_SUPPORT_USD_PER_HOUR = Figure(0.10, EKS_PRICING_URL, READ_ON)
EKS_EXTENDED_SUPPORT_USD_PER_HOUR = Figure(0.60, EKS_PRICING_URL, READ_ON)
# A NAT gateway per hour it exists (its per-GB processing charge comes on top), and the public IPv4
# address it holds (an Elastic IP, billed per hour since February 2024).
NAT_GATEWAY_USD_PER_HOUR = Figure(0.045, VPC_PRICING_URL, READ_ON)
PUBLIC_IPV4_USD_PER_HOUR = Figure(0.005, VPC_PRICING_URL, READ_ON)
# gp3 storage per GB-month; the EBS pricing page turns months into hours at 730 hours a month.
GP3_USD_PER_GB_MONTH = Figure(0.08, EBS_PRICING_URL, READ_ON)
HOURS_PER_MONTH = 730
# The system node types: the default, and m5.large, which the preflight names as another; On-Demand Linux.
SYSTEM_INSTANCE_USD_PER_HOUR: dict[str, Figure] = {
    "m7i.xlarge": Figure(0.2016, ON_DEMAND_PRICES_URL, READ_ON),
    "m5.large": Figure(0.096, ON_DEMAND_PRICES_URL, READ_ON),
}
# EC2 bills a Linux On-Demand instance per second while it is `running`, with a minimum of 60 seconds
# each time it starts (AWS announcement of per-second billing, 2017-10-02; EC2 user guide, "Instance
# state changes": billed in `running` only).
EC2_BILLING_URL = (
    "https://aws.amazon.com/about-aws/whats-new/2017/10/announcing-amazon-ec2-per-second-billing/"
)
EC2_MINIMUM_BILLED_S = 60


def shipped_on_demand_usd(instance_type: str) -> Figure | None:
    """The shipped On-Demand hourly price of a type, GPU or system, or None for a type without one."""
    gpu = INSTANCES.get(instance_type)
    return gpu.usd_per_hour if gpu else SYSTEM_INSTANCE_USD_PER_HOUR.get(instance_type)


# GPUs with FP8 tensor cores (Ada: L4, L40S; Hopper: H100, H200), where a float8 all-gather
# halves the gathered bytes; the A100 has none.
FP8_GPUS = ("L4", "L40S", "H100", "H200")

# --- measured on one GPU (cited from the benchmark reports, never read) ---------------------------
THROUGHPUT_REPORT = "bench/reports/throughput_h200_202612.md"
MEMORY_REPORT = "bench/reports/memory_h200_202612.md"
MEASURED_ON = "2026-12-03"


@dataclass(frozen=True)
class MfuPoint:
    """A benchmark case's model FLOPs utilisation (`6·N + 12·L·H·S` FLOPs per token over its GPU's
    bf16 peak, `training.metrics.flops`); the figure's source is the report, `record` the raw JSON
    beside it that holds `case`."""

    mfu: Figure
    case: str
    record: str
    tokens_per_micro_batch: int
    activation_checkpointing: bool
    gpu_name: str

    @property
    def label(self) -> str:
        return f"{self.mfu.source} {self.case}"


# All ran on one H200 on synthetic tokens (causal rows, SDPA); isolated documents with flex ran at
# more tokens/s (bench/reports/flex-attention_h200_202612.md; the record, 61.1% as counted here and
# 50.5% on the attention done, is one H100's without checkpointing, bench/reports/mfu_h100_202612.md),
# so forecasts of a corpus run are on the
# low side. Activation checkpointing changes the work per token, so a forecast uses a point with its
# own setting, the one nearest in tokens per micro-batch.
MFU_POINTS = (
    # AWS's sample loop: bf16 weights, plain AdamW, seq 128 x 1; the record's own `mfu`.
    MfuPoint(
        Figure(0.008866044513304722, THROUGHPUT_REPORT, MEASURED_ON),
        case="reference-bf16-adamw-128x1",
        record="h200-throughput.json",
        tokens_per_micro_batch=128,
        activation_checkpointing=False,
        gpu_name="NVIDIA H200",
    ),
    # The tuned compiled loop at 4096 x 4; the record's own `mfu`.
    MfuPoint(
        Figure(0.535980357172838, THROUGHPUT_REPORT, MEASURED_ON),
        case="tuned-compiled-4096x4",
        record="h200-throughput.json",
        tokens_per_micro_batch=16384,
        activation_checkpointing=False,
        gpu_name="NVIDIA H200",
    ),
    # The `throughput` preset (4096 x 2, checkpointing, HSDP 2 x 4) at world size 8 under the fake
    # process group (collectives free): its `tokens_per_s_per_gpu` by the formula.
    MfuPoint(
        Figure(0.3638423917401991, MEMORY_REPORT, MEASURED_ON),
        case="seq4096x2-ac-hsdp-2x4",
        record="h200-deferred-and-memory.json",
        tokens_per_micro_batch=8192,
        activation_checkpointing=True,
        gpu_name="NVIDIA H200",
    ),
)


@dataclass(frozen=True)
class ThroughputFigure:
    """A measured tokens/s of the tuned compiled loop at seq 4096 on one GPU, which the planner's
    comparison (docs/benchmarks.md) predicts from the nearest MFU point."""

    tokens_per_s: Figure
    case: str
    record: str
    batch_size: int
    grad_accum_steps: int = 1
    defer_grad_sync: bool = False


def _h200_figure(tokens_per_s: float, case: str, batch_size: int, **accumulation: Any) -> ThroughputFigure:
    return ThroughputFigure(
        Figure(tokens_per_s, THROUGHPUT_REPORT, MEASURED_ON),
        case,
        "h200-throughput.json",
        batch_size,
        **accumulation,
    )


H200_THROUGHPUT = (
    _h200_figure(46595.86438724147, "tuned-compiled-4096x4", 4),
    _h200_figure(49357.26041007914, "tuned-compiled-4096x8", 8),
    _h200_figure(50130.76754317468, "tuned-compiled-4096x12", 12),
    _h200_figure(50679.599515085094, "tuned-compiled-accum2-4096x12", 12, grad_accum_steps=2),
    _h200_figure(50942.24937139152, "tuned-compiled-accum4-4096x12", 12, grad_accum_steps=4),
    _h200_figure(
        51102.854750690945,
        "tuned-compiled-accum4-deferred-4096x10",
        10,
        grad_accum_steps=4,
        defer_grad_sync=True,
    ),
    _h200_figure(
        50965.94333819446,
        "tuned-compiled-accum4-deferred-4096x12",
        12,
        grad_accum_steps=4,
        defer_grad_sync=True,
    ),
    _h200_figure(
        51303.53638824143,
        "tuned-compiled-accum8-deferred-4096x10",
        10,
        grad_accum_steps=8,
        defer_grad_sync=True,
    ),
)

AWS_SAMPLE_URL = (
    "https://github.com/aws-samples/sample-aws-deep-learning-containers/tree/main/training/ray-train "
    "(README.md, 'Benchmark: EFA/RDMA vs TCP'; code/train.py)"
)
# AWS's sample: Qwen2.5-1.5B in bf16 (no mixed precision, so gradients reduce in bf16), FSDP
# FULL_SHARD over 2 x g6.12xlarge (world size 8), seq 128 x batch 1, 20 steps, 3 discarded.
AWS_SAMPLE_EFA_STEPS_PER_S = Figure(0.5173, AWS_SAMPLE_URL, READ_ON)
AWS_SAMPLE_TCP_STEPS_PER_S = Figure(0.2513, AWS_SAMPLE_URL, READ_ON)
AWS_SAMPLE_SEQ_LEN = 128
AWS_SAMPLE_BATCH = 1
AWS_SAMPLE_INSTANCE = "g6.12xlarge"
AWS_SAMPLE_NODES = 2


@dataclass(frozen=True)
class AllReduceFigure:
    """A published nccl-tests `all_reduce_perf` line: fp32 sum of `size_bytes` over the nodes."""

    instance_type: str
    nodes: int
    size_bytes: int
    time_us: Figure
    busbw_gbytes_per_s: Figure


NCCL_TESTS = (
    # 2 x p4dn.24xlarge (the p4d with EFA), 16 ranks, out-of-place, FI_EFA_USE_DEVICE_RDMA=1.
    AllReduceFigure(
        instance_type="p4d.24xlarge",
        nodes=2,
        size_bytes=1073741824,
        time_us=Figure(35215, "https://github.com/NVIDIA/nccl/issues/527 (2022-07-25)", READ_ON),
        busbw_gbytes_per_s=Figure(57.17, "https://github.com/NVIDIA/nccl/issues/527 (2022-07-25)", READ_ON),
    ),
)

# DescribeInstanceTypes `NetworkPerformance`: "40 Gigabit", "4x 100 Gigabit", "Up to 25 Gigabit".
_NETWORK_PERFORMANCE = re.compile(r"(?:Up to )?(?:(\d+)x )?(\d+(?:\.\d+)?) Gigabit")


def line_rate_gbps(network_performance: str) -> float | None:
    """The line rate in Gbps a `NetworkPerformance` text states (the burst rate of an "Up to"), or
    None for one without a number ("High", "Moderate")."""
    match = _NETWORK_PERFORMANCE.fullmatch(network_performance.strip())
    if not match:
        return None
    return int(match.group(1) or 1) * float(match.group(2))
