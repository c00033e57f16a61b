"""The fabric gate: the verdict on the fabric before a training job is submitted.

Pods starting proves nothing, and a job that finds a silent TCP fallback only in its logs has
already been paid for (an hour of two GPU nodes with the `throughput` preset). So before each job
the fabric probe (`fabric`, `python -m training.fabric_probe`) runs on the job's worker group with
the job's NCCL environment, for a minute or so, and its run is judged as the job's would be:

1. NCCL's transport from the probe's own NCCL lines, covering every rank and worker pod (`evidence`);
2. with `efa` expected, each worker node's EFA counters, read by the node's counter reader around
   this very probe (`efa_counters`), must have moved at least half of what the probe's collectives
   must bring into each node (`efa_counters.probe_floor`); a node whose counters could not be read
   fails too, since a check that cannot measure must not pass (`training.checkEfaCounters: false`
   turns the counter check off, and the outputs say so). With `socket` expected (the benchmark's
   TCP baseline), the counters must *not* have moved that much: else the baseline is no TCP run;
3. with `efa` expected, each collective's busbw at the largest size must clear
   `min_busbw_fraction` of the line rate (`fabric.busbw_problems`).

Every `pulumi up` that runs a job runs a fresh probe (`jobs.choose_submission`, `rejudge=False`):
re-running `up` never turns a failed gate into a passed one.

The first check that fails is the one line `pulumi up` ends with; no job is submitted. The gate
that passed goes into the stack outputs beside the job's verdict.

The probe no longer runs again after the job: it would measure the same collectives on the same
pods with the same environment minutes later, costing a second probe job per variant, and a fabric
that degrades during the job shows in the job's own EFA counters and its per-step EFA bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.efa_counter_reader import READER_NAMESPACE
from workloads.training_run.access.jobs import NCCL_LOG_DIR
from workloads.training_run.errors import TrainingRunError
from workloads.training_run.verdicts.efa_counters import counter_problems, probe_floor
from workloads.training_run.verdicts.evidence import RAY_LOG_DIR, JobResult
from workloads.training_run.verdicts.fabric import ProbeResult, busbw_problems

TRANSPORT_FIX = (
    "check that the worker pods request vpc.amazonaws.com/efa and set FI_PROVIDER=efa and "
    "NCCL_NET_PLUGIN=ofi, and read the 'NET/OFI' lines of the probe's NCCL log files on the worker pods "
    "({files}): they say why aws-ofi-nccl did not load"
)
COUNTERS_FIX = (
    "check that each worker pod requests vpc.amazonaws.com/efa, that its node's EFA devices are up "
    "(`fi_info -p efa` in the worker pod), and that the instance type's EFA interfaces are attached"
)
READER_FIX = (
    f"check the EFA counter reader pods (`kubectl -n {READER_NAMESPACE} get pods -o wide`, then `kubectl -n "
    f"{READER_NAMESPACE} describe pod` and `logs` of the one on that node); or set training.checkEfaCounters "
    "to false to judge the fabric without its counters (the outputs then say the check was off)"
)
TCP_BASELINE_FIX = (
    "stop whatever else uses EFA on the GPU nodes during the benchmark (`ray job list` in the head pod), "
    "and check that the TCP baseline's environment (NCCL_NET=Socket, NCCL_NET_PLUGIN=none) reaches its workers"
)
BUSBW_FIX = (
    "check the EFA interfaces per node against the instance type's, and the placement group; or lower "
    "training.minBusbwFraction (0 turns the floor off)"
)


@dataclass(frozen=True)
class GateResult:
    """The probe run before a job: its run judged as a job's (`run.summary` is the probe's JSON
    report), its busbw, and the seconds from the pods being ready to this verdict."""

    run: JobResult
    probe: ProbeResult
    seconds: float


def gate_problem(
    gate: GateResult,
    expect: str,
    line_rate_gbps: float | None,
    min_fraction: float,
    check_counters: bool = True,
) -> tuple[str, str] | None:
    """(what is wrong, the fix) for the first check the gate fails, one line each; None: it passed."""
    run, verdict = gate.run, gate.run.verdict
    if not verdict.ok(expect):
        first = f"; first evidence: {verdict.evidence[0].strip()}" if verdict.evidence else ""
        files = (
            f"{NCCL_LOG_DIR}/nccl-{run.submission_id}.*.log, or {RAY_LOG_DIR}/worker-*.out for a probe "
            "submitted without them"
        )
        return (
            f"NCCL used '{verdict.transport}' between the nodes, not '{expect}' ({verdict.confidence} "
            f"confidence): {verdict.reason}{first}",
            TRANSPORT_FIX.format(files=files) if expect == "efa" else "check the job's NCCL environment",
        )
    if check_counters and (found := counter_problem(gate, expect)):
        return found
    if expect != "efa":
        return None
    if slow := busbw_problems(gate.probe.busbw_gbps, line_rate_gbps, min_fraction):
        return (
            f"the fabric is too slow for EFA at {gate.probe.largest_bytes} byte messages: {'; '.join(slow)}",
            BUSBW_FIX,
        )
    return None


def counter_problem(gate: GateResult, expect: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) when the worker nodes' EFA counters around the probe do not show
    what `expect` says: the probe's traffic over EFA, or none of it for a TCP baseline."""
    traffic, floor = gate.run.efa, probe_floor(gate.probe.least_node_bytes)
    if traffic is None:
        return "the EFA counters around the probe were not read", READER_FIX
    if floor is None:
        return (
            "the probe's report does not say how many calls it made, so the bytes it must have moved are unknown",
            "run `pulumi up` again: the probe of this release's code reports its `iters` and `warmup_iters`",
        )
    problems = counter_problems(traffic, expect, floor)
    if not problems:
        return None
    found = f"{'; '.join(problems)} (EFA bytes per worker pod during the probe: {traffic.bytes_moved()})"
    unread = f"; for the nodes not read, {READER_FIX}" if traffic.unavailable else ""
    if expect == "socket":
        return (
            f"the TCP baseline's probe cannot be shown to have run on TCP alone: {found}",
            TCP_BASELINE_FIX + unread,
        )
    if len(problems) == len(traffic.unavailable):
        what = "the EFA counters of the worker nodes could not be read, so nothing shows the probe's traffic on EFA"
        return f"{what}: {found}", READER_FIX
    what = (
        "NCCL's log says EFA, but the EFA counters of the worker nodes did not move with the probe's traffic"
    )
    return f"{what}: {found}", COUNTERS_FIX + unread


def check_gate(
    gate: GateResult,
    expect: str,
    line_rate_gbps: float | None,
    min_fraction: float,
    check_counters: bool = True,
) -> None:
    """Stop the run, in one line, when the gate failed: the training job is then not submitted."""
    found = gate_problem(gate, expect, line_rate_gbps, min_fraction, check_counters)
    if found is None:
        return
    problem, fix = found
    note = f" (note: {gate.run.rejudged})" if gate.run.rejudged else ""
    raise TrainingRunError(
        f"the fabric gate (probe job {gate.run.submission_id}, {gate.seconds:.1f} s after the pods were "
        f"ready) failed, so the training job was not submitted: {problem}. Fix: {fix}{note}"
    )
