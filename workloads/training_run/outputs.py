"""The TrainingRun's outputs, declared once (`RunOutputs`), and the stack outputs `training` and
`benchmark` built from that declaration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel

from workloads.training_run.attempts import restarts_of
from workloads.training_run.node_hours import GpuNodeLaunches
from workloads.training_run.verdicts.evidence import JobResult
from workloads.training_run.verdicts.fabric import busbw_fractions
from workloads.training_run.verdicts.gate import GateResult

# --- the outputs, and the stack output `training` built from their declaration -----------------------

# Where an output shows in the stack output `training` (`training_output`): at its top or in its
# `gate` group. An output declared without `shown` is the resource's alone.
TOP, GATE = "", "gate"
# The stack output `benchmark` (with `benchmark` on): the EFA run beside the TCP baseline.
BENCHMARK = "benchmark"
# Inputs the `training` output shows beside the outputs: the line rate `busbw_fraction` is a share of,
# and whether the EFA counters were judged (off only by the stack key, and then said).
SHOWN_INPUTS = ("line_rate_gbps", "check_efa_counters")


def shown(group: str | None = TOP, *, key: str | None = None, benchmark: str | None = None) -> dict[str, Any]:
    """The metadata of a `RunOutputs` field that the stack output `training` shows in `group` (None:
    not there), under `key` or else its name camelCased (without the `gate_` prefix in the `gate`
    group); `benchmark`: its key in the stack output `benchmark` too."""
    placements: dict[str, str | None] = {} if group is None else {group: key}
    if benchmark:
        placements[BENCHMARK] = benchmark
    return {"shown": placements}


@dataclass(frozen=True)
class RunOutputs:
    """The resource's outputs; the `tcp_*` ones and `efa_speedup` only with `benchmark`. `efa_bytes`
    (bytes moved through each worker node's EFA ports during the job: `efa_sysfs.MOVED`) and
    `efa_counters` (each counter's delta), per worker pod, are None for a node whose counters are
    unknown; `efa_unavailable` says why for each node whose counters could not be read, or whose pod was
    replaced during the job (None: all were read on both sides of it).
    The `gate_*` ones are the fabric gate's that passed before the job (`gate`): its probe job, its
    NCCL verdict and evidence, its EFA bytes per worker pod, and `gate_s`, the seconds from the pods
    being ready to its verdict; `busbw_gbps` is its bus bandwidth per collective at the largest
    message size, and `busbw_fraction` that over the `line_rate_gbps` input (None without one).
    `gpu_nodes_released_at`: with `gpu_nodes_after_training` release, when EKS accepted the GPU node
    group's scale-down to 0 after the job, or the later one of an `update` that released a replaced
    group or one kept until then (ISO 8601 UTC; the nodes drain and stop within about 5 minutes of
    it); None when the nodes were kept.
    `gpu_nodes` are the GPU nodes the run saw (at readiness, after each job, at the end), each with
    its EC2 `instanceId`, `launchTime`, `stoppedAt` for one that stopped running, and `unavailable`
    for one whose hours cannot be counted (`ec2_instances.instance_record`); None with
    `gpu_nodes_unavailable` saying why. `finished_at` is the time these outputs were made (ISO 8601,
    UTC): the stack's `training.cost` counts GPU node hours from each launch to its stop, the nodes'
    release, or the other when they were kept. `tcp_summary`: the TCP baseline's run summary, whose
    tokens the cost's US$ per million tokens counts beside the job's."""

    job_id: str = dataclasses.field(metadata=shown())
    status: str = dataclasses.field(metadata=shown())
    transport: str = dataclasses.field(metadata=shown())
    transport_reason: str
    evidence: list[str] = dataclasses.field(metadata=shown())
    worker_log_files: dict[str, int]
    tokens_per_s: float | None = dataclasses.field(metadata=shown(benchmark="efaTokensPerS"))
    mfu: float | None = dataclasses.field(metadata=shown())
    # The summary's MFU on the work done (attention over the pairs the documents attend); None from a
    # job of a release before it.
    mfu_done: float | None = dataclasses.field(metadata=shown())
    step_time_s: float | None = dataclasses.field(metadata=shown())
    duration_s: float | None = dataclasses.field(metadata=shown())
    summary: dict
    efa_bytes: dict[str, int | None] | None = dataclasses.field(
        default=None, metadata=shown(benchmark="efaBytes")
    )
    efa_counters: dict[str, dict[str, int] | None] | None = dataclasses.field(default=None, metadata=shown())
    efa_unavailable: dict[str, str] | None = dataclasses.field(default=None, metadata=shown())
    gate_job_id: str | None = dataclasses.field(default=None, metadata=shown(GATE))
    gate_transport: str | None = dataclasses.field(default=None, metadata=shown(GATE))
    gate_transport_reason: str | None = None
    gate_evidence: list[str] | None = dataclasses.field(default=None, metadata=shown(GATE))
    gate_efa_bytes: dict[str, int | None] | None = dataclasses.field(default=None, metadata=shown(GATE))
    gate_efa_unavailable: dict[str, str] | None = dataclasses.field(default=None, metadata=shown(GATE))
    gate_s: float | None = dataclasses.field(default=None, metadata=shown(GATE, key="seconds"))
    busbw_gbps: dict[str, float] | None = dataclasses.field(
        default=None, metadata=shown(benchmark="efaBusbwGbps")
    )
    busbw_fraction: dict[str, float] | None = dataclasses.field(default=None, metadata=shown())
    tcp_job_id: str | None = None
    tcp_transport: str | None = dataclasses.field(
        default=None, metadata=shown(None, benchmark="tcpTransport")
    )
    tcp_evidence: list[str] | None = None
    tcp_tokens_per_s: float | None = dataclasses.field(
        default=None, metadata=shown(None, benchmark="tcpTokensPerS")
    )
    tcp_summary: dict | None = None
    tcp_efa_bytes: dict[str, int | None] | None = dataclasses.field(
        default=None, metadata=shown(None, benchmark="tcpEfaBytes")
    )
    tcp_gate_job_id: str | None = None
    tcp_busbw_gbps: dict[str, float] | None = dataclasses.field(
        default=None, metadata=shown(None, benchmark="tcpBusbwGbps")
    )
    efa_speedup: float | None = dataclasses.field(default=None, metadata=shown(None, benchmark="efaSpeedup"))
    gpu_nodes_released_at: str | None = dataclasses.field(default=None, metadata=shown())
    # The job's restarts from a checkpoint and one record per restart (`attempts.ATTEMPT_KEYS`), as
    # its summary reports them; None when it reports none.
    restarts: int | None = dataclasses.field(default=None, metadata=shown())
    attempts: list[dict[str, Any]] | None = dataclasses.field(default=None, metadata=shown())
    gpu_nodes: dict[str, dict[str, str]] | None = None
    gpu_nodes_unavailable: str | None = None
    finished_at: str | None = None

    @classmethod
    def of(
        cls,
        main: tuple[GateResult, JobResult],
        tcp: tuple[GateResult, JobResult] | None,
        line_rate_gbps: float | None,
        launches: GpuNodeLaunches,
        released_at: str | None = None,
    ) -> RunOutputs:
        gate, job = main
        summary = job.summary
        restarts = restarts_of(summary)
        outputs = cls(
            gpu_nodes_released_at=released_at,
            restarts=restarts.restarts,
            attempts=restarts.attempts,
            job_id=job.submission_id,
            status=job.status,
            transport=job.verdict.transport,
            transport_reason=job.verdict.reason,
            evidence=list(job.verdict.evidence),
            worker_log_files=dict(job.log_files),
            tokens_per_s=summary.get("tokens_per_s"),
            mfu=summary.get("mfu"),
            mfu_done=summary.get("mfu_done"),
            step_time_s=summary.get("step_time_s"),
            duration_s=summary.get("duration_s"),
            summary=summary,
            efa_bytes=job.efa.bytes_moved() if job.efa else None,
            efa_counters=dict(job.efa.deltas) if job.efa else None,
            efa_unavailable=job.efa.unmeasured() or None if job.efa else None,
            gate_job_id=gate.run.submission_id,
            gate_transport=gate.run.verdict.transport,
            gate_transport_reason=gate.run.verdict.reason,
            gate_evidence=list(gate.run.verdict.evidence),
            gate_efa_bytes=gate.run.efa.bytes_moved() if gate.run.efa else None,
            gate_efa_unavailable=dict(gate.run.efa.unavailable)
            if gate.run.efa and gate.run.efa.unavailable
            else None,
            gate_s=gate.seconds,
            busbw_gbps=gate.probe.busbw_gbps,
            busbw_fraction=busbw_fractions(gate.probe.busbw_gbps, line_rate_gbps),
            gpu_nodes=launches.nodes,
            gpu_nodes_unavailable=launches.unavailable,
            finished_at=launches.at,
        )
        if tcp is None:
            return outputs
        tcp_gate, tcp_job = tcp
        main_rate, tcp_rate = summary.get("tokens_per_s"), tcp_job.summary.get("tokens_per_s")
        return dataclasses.replace(
            outputs,
            tcp_job_id=tcp_job.submission_id,
            tcp_transport=tcp_job.verdict.transport,
            tcp_evidence=list(tcp_job.verdict.evidence),
            tcp_tokens_per_s=tcp_rate,
            tcp_summary=tcp_job.summary,
            tcp_efa_bytes=tcp_job.efa.bytes_moved() if tcp_job.efa else None,
            tcp_gate_job_id=tcp_gate.run.submission_id,
            tcp_busbw_gbps=tcp_gate.probe.busbw_gbps,
            efa_speedup=round(main_rate / tcp_rate, 3) if main_rate and tcp_rate else None,
        )


OUTPUTS = tuple(f.name for f in dataclasses.fields(RunOutputs))


def training_output_keys() -> dict[str, dict[str, str]]:
    """The stack output `training`'s keys by group (`TOP`, `GATE`), each with the output or input it
    shows: the `shown` outputs, then `SHOWN_INPUTS`, camelCased."""
    groups = _shown_keys()
    groups[TOP].update({to_camel(name): name for name in SHOWN_INPUTS})
    return {TOP: groups[TOP], GATE: groups[GATE]}


def benchmark_output_keys() -> dict[str, str]:
    """The stack output `benchmark`'s keys, each with the output it shows."""
    return _shown_keys()[BENCHMARK]


def _shown_keys() -> dict[str, dict[str, str]]:
    groups: dict[str, dict[str, str]] = {TOP: {}, GATE: {}, BENCHMARK: {}}
    for field in dataclasses.fields(RunOutputs):
        for group, key in field.metadata.get("shown", {}).items():
            name = field.name.removeprefix(f"{group}_") if group == GATE else field.name
            groups[group][key or to_camel(name)] = field.name
    return groups


def training_output(run: object) -> dict[str, Any]:
    """The run's part of the stack output `training`: its outputs by `training_output_keys`, the
    `gate` group nested."""
    groups = training_output_keys()
    shown_outputs: dict[str, Any] = {key: getattr(run, name) for key, name in groups[TOP].items()}
    shown_outputs[GATE] = {key: getattr(run, name) for key, name in groups[GATE].items()}
    return shown_outputs


def benchmark_output(run: object) -> dict[str, Any]:
    """The stack output `benchmark`: the EFA run's measurements beside the TCP baseline's, by `benchmark_output_keys`."""
    return {key: getattr(run, name) for key, name in benchmark_output_keys().items()}
