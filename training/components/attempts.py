"""Every restart of a run recorded: its cause, the node, the steps it lost and the seconds it took.

Ray Train restarts a failed worker group from the latest checkpoint (`--max-failures`). Its
controller outlives the workers, so a callback there (`training.launch.attempt_store.AttemptRecorder`)
writes each fault to `ATTEMPTS_FILE` in the run's storage folder; the restarted rank 0 reads it back
(`Session.faults`), refuses a restart that cannot help, prints one line per restart after its first
step and puts the attempts in the run summary. Everything here is plain Python over those records.

An attempt is one life of the worker group: the first from the job's start, each later one from a
restart. The run summary's `attempts` records each attempt a restart began, in this order, as
`ATTEMPT_KEYS`: its number (n: the n-th restart began it), the cause of the fault that ended the one
before (one line), the node of the failed worker where known, the last step every rank finished
before the fault, the checkpoint's step it resumed from, the steps between the two, and
the seconds from the fault's detection to the first step finished after the restart (None while, or
if never, one finished). The stored record adds `DETECTED_AT` (Unix seconds, the controller's clock).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.config.run_config import TrainConfig
from training.errors import RestartRefusedError
from training.metrics.report import ATTEMPT_KEYS, format_node_leaving_line

# In the run's folder beside its checkpoints (`<storage-path>/<run-name>/`), on any filesystem Ray
# Train stores to (s3:// on a cluster).
ATTEMPTS_FILE = "attempts.json"
DETECTED_AT = "detected_at"
# A stored attempt's mark of a fault that was a node's drain (eviction, repair, a node taken out of
# the job), which does not count as the node failing; an older record without it was no drain.
DRAINED = "drained"
# Restarts after faults that named a node, more than one in a row, wait before training: 30 s, then
# twice as long each time, at most 4 minutes. Time for the EKS node monitoring agent to see a failing
# GPU or network (it marks the node within minutes; infra/aws_rules/node_repair.py) rather than
# burning --max-failures on the same fault. The wait counts in the restart's recovery.
BACKOFF_S = 30.0
BACKOFF_MAX_S = 240.0
# How often ranks waiting for a failing node to be taken out ask for the drain that takes it.
LEAVE_POLL_S = 5.0
# A cause is one line; a long exception message is cut here.
CAUSE_CHARS = 240
# The first line of every actor-death message; the line that says why follows its indented fields
# (ray/exceptions.py, ActorDiedError.__init__).
ACTOR_DIED = "The actor died unexpectedly before finishing this task."
# What a surviving rank's collective raises once a peer is gone: a symptom of the fault, not its
# cause. gloo's TCP pair on a closed or reset connection (gloo/transport/tcp/pair.cc, "Read error
# ...: Connection reset by peer", seen here when a worker node's raylet was killed), and NCCL's
# ncclRemoteError ("remote process exited or there was a network error", nccl's
# ncclGetErrorString). It often reaches Ray Train's controller before the lost rank's own death,
# which the controller then never polls: the fault's node is then that of the ranks gone silent.
PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "remote process exited or there was a network error",
)


# Why an actor died, as Ray's GCS words it (ray src/ray/gcs/gcs_actor_manager.cc, the death causes
# it builds): its node is gone, or only its worker process.
NODE_DIED = "because its node has died"
PROCESS_DIED = "because its worker process has died"


@dataclass(frozen=True)
class WorkerError:
    """One worker's error as the controller saw it."""

    rank: int
    died: bool  # its process or node is gone (Ray's RayActorError), not an exception it raised
    kind: str  # the exception's type name
    message: str
    preempted: bool = False  # its node was drained (RayActorError.preempted: a drain's deadline passed)

    @property
    def node_lost(self) -> bool:
        """Its node went away (drained, or dead to Ray's GCS), not only its process."""
        return self.preempted or (self.died and NODE_DIED in self.message)


def _why(error: WorkerError) -> str:
    """What happened, from an error's message: its first line, or for a death the first sentence of
    the line after Ray's fixed one and its fields (the rest lists causes that may not apply)."""
    lines = [
        line.strip() for line in error.message.splitlines() if line.strip() and not line.startswith("\t")
    ]
    if not lines:
        return ""
    if not error.died:
        return lines[0]
    why = lines[1] if lines[0] == ACTOR_DIED and len(lines) > 1 else lines[0]
    return why.split(". ", 1)[0].rstrip(".") + "."


def lost_a_peer(error: WorkerError) -> bool:
    """The error a rank's collective raised because another rank is gone (`PEER_LOST`)."""
    return not error.died and any(symptom in error.message for symptom in PEER_LOST)


def _one_node(ranks: Sequence[int], hosts: Mapping[int, str]) -> str | None:
    """The node every one of `ranks` ran on; None where they ran on several or one is unknown."""
    nodes = {hosts.get(rank) for rank in ranks}
    return nodes.pop() if len(nodes) == 1 else None


def _and_others(count: int) -> str:
    return f" (and {count} other rank{'s' if count > 1 else ''})" if count else ""


def _cut(line: str) -> str:
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


def _where(rank: int, hosts: Mapping[int, str]) -> str:
    return f"rank {rank}" + (f" on {hosts[rank]}" if rank in hosts else "")


def _report(error: WorkerError) -> str:
    why = _why(error)
    return f"{error.kind}" + (f": {why}" if why else "")


def awaits_node_deaths(errors: Sequence[WorkerError], hosts: Mapping[int, str]) -> bool:
    """Whether the errors could be a lost node's, not yet reported: worker processes died on one
    node alone while another node's ranks stay silent. Under NCCL's error handling a node's loss
    kills the survivors' processes within seconds, before Ray's GCS declares the lost node dead
    (its raylet misses health checks for about 15 s: ray's `health_check_period_ms` 3000 ×
    `health_check_failure_threshold` 5), so the survivors' node would be blamed."""
    if any(error.node_lost or not (error.died or lost_a_peer(error)) for error in errors):
        return False
    died = [error.rank for error in errors if error.died]
    node = _one_node(died, hosts) if died else None
    silent = set(hosts) - {error.rank for error in errors}
    return node is not None and any(hosts[rank] != node for rank in silent)


def fault_cause(
    errors: Sequence[WorkerError], hosts: Mapping[int, str], lost_nodes: Collection[str] = ()
) -> tuple[str, str | None]:
    """One line naming what failed, and the node it ran on where known; by kind, first to last:

    - a node that went away: a drained or dead node among the errors, or one Ray's GCS reports dead
      (`lost_nodes`), is the fault, whatever its loss did to the other nodes' ranks;
    - an error a rank raised of its own (not a lost peer's symptom): its node, where the ranks that
      raised one share a node;
    - worker processes that died: under NCCL's error handling (TORCH_NCCL_ASYNC_ERROR_HANDLING=1,
      which the job sets) a peer's loss kills the survivors' processes too, so deaths on one node
      name it, and deaths on several nodes leave the node unknown;
    - only lost-peer errors: the ranks gone silent are the fault, on their node where they share one.

    `hosts` maps each rank of the attempt to its node. Where the node is unknown, nothing is refused
    on a guess (`restart_refusal`)."""
    lost = sorted(set(lost_nodes) & set(hosts.values()))
    gone = [error for error in errors if error.node_lost]
    if gone or lost:
        nodes = sorted({*lost, *(hosts[error.rank] for error in gone if error.rank in hosts)})
        node = nodes[0] if len(nodes) == 1 else None
        what = "was drained" if any(error.preempted for error in gone) else "was lost"
        named = f"node {node}" if node else f"nodes {', '.join(nodes)}" if nodes else "a node"
        first = min(gone or errors, key=lambda error: error.rank)
        seen = "" if gone else "Ray's GCS reports it dead; "
        detail = f"{seen}{_where(first.rank, hosts)}{_and_others(len(gone or errors) - 1)}: {_report(first)}"
        return _cut(f"{named} {what} ({detail})"), node
    raised = [error for error in errors if not error.died and not lost_a_peer(error)]
    died = [error for error in errors if error.died]
    if raised or died:
        culprits = raised or died
        first = min(culprits, key=lambda error: error.rank)
        node = _one_node([error.rank for error in culprits], hosts)
        what = "raised" if raised else "died"
        line = f"{_where(first.rank, hosts)} {what}{_and_others(len(errors) - 1)}: {_report(first)}"
        if not raised and node is None:
            line += " (on several nodes: the node is unknown)"
        return _cut(line), node
    first = min(errors, key=lambda error: error.rank)
    silent = sorted(set(hosts) - {error.rank for error in errors})
    node = _one_node(silent, hosts) if silent else None
    if node:
        gone_line = f"rank {silent[0]} on {node}{_and_others(len(silent) - 1)}"
        return _cut(
            f"{gone_line} stopped answering; {_where(first.rank, hosts)} lost it: {_report(first)}"
        ), node
    return _cut(f"{_where(first.rank, hosts)} lost a peer: {_report(first)}"), None


def record_fault(
    record: Sequence[Mapping[str, Any]],
    *,
    cause: str,
    node: str | None,
    failed_after_step: int,
    resumed_from_step: int,
    detected_at: float,
    drained: bool = False,
) -> list[dict[str, Any]]:
    """The record with one more attempt: the restart Ray Train makes after this fault, from the
    latest checkpoint (`resumed_from_step`, which the restarted rank 0 confirms). `drained`: the
    fault was a node's drain, which says nothing of the node's health (`DRAINED`)."""
    return [
        *map(dict, record),
        {
            "attempt": len(record) + 1,
            "cause": cause,
            "node": node,
            "failed_after_step": failed_after_step,
            "resumed_from_step": resumed_from_step,
            "lost_steps": max(0, failed_after_step - resumed_from_step),
            "recovery_s": None,
            DETECTED_AT: detected_at,
            DRAINED: drained,
        },
    ]


def record_recovery(
    record: Sequence[Mapping[str, Any]], *, first_step: int, at: float
) -> list[dict[str, Any]]:
    """The record once the latest attempt finished its first step (`first_step`, at Unix time
    `at`): the step it resumed from, the steps lost and the seconds recovering, from there."""
    if not record or record[-1]["recovery_s"] is not None:
        return [*map(dict, record)]
    last = dict(record[-1])
    last["resumed_from_step"] = first_step - 1
    last["lost_steps"] = max(0, last["failed_after_step"] - last["resumed_from_step"])
    last["recovery_s"] = round(max(0.0, at - last[DETECTED_AT]), 3)
    return [*map(dict, record[:-1]), last]


def recovery_spent_s(record: Sequence[Mapping[str, Any]]) -> float:
    """Seconds spent recovering by the attempts before the latest: each one's recovery, or for one
    that failed again before finishing a step, the time from its fault to the next."""
    spent = 0.0
    for attempt, after in itertools.pairwise(record):
        recovery = attempt["recovery_s"]
        spent += recovery if recovery is not None else after[DETECTED_AT] - attempt[DETECTED_AT]
    return spent


def _node_faults(record: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The trailing attempts whose faults named a node and were not drains, oldest first."""
    trailing: list[Mapping[str, Any]] = []
    for attempt in reversed(record):
        if not attempt["node"] or attempt.get(DRAINED, False):
            break
        trailing.insert(0, attempt)
    return trailing


def failing_node(record: Sequence[Mapping[str, Any]], nodes: Sequence[str]) -> str | None:
    """The node of the last two faults, where both named it, neither was a drain, and it is among
    this attempt's `nodes` (by rank) beside another node: a restart there would meet it again."""
    faults = _node_faults(record)[-2:]
    if len(faults) < 2 or faults[0]["node"] != faults[1]["node"]:
        return None
    node = faults[1]["node"]
    return node if node in nodes and len(set(nodes)) > 1 else None


def restart_backoff_s(record: Sequence[Mapping[str, Any]]) -> float:
    """Seconds a restart waits before it trains: none after one fault, `BACKOFF_S` doubling after
    each further fault in a row that named a node (`BACKOFF_MAX_S` at most)."""
    count = len(_node_faults(record))
    return 0.0 if count < 2 else min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (count - 2))


def restart_refusal(
    record: Sequence[Mapping[str, Any]], *, budget_s: float, nodes: Sequence[str], leave: bool
) -> str | None:
    """Why the restart now starting must not train (one line with the fix), or None. A fault on the
    node of the fault before it (`failing_node`) would recur there: refused, unless the run takes
    such a node out (`leave`, --leave-failing-node); a run whose earlier recoveries spent
    --recovery-budget-s gets no more. Judged from the record and the attempt's nodes alone, so every
    rank decides alike. A diverged loss is never retried at all (`training.errors.DivergedError`)."""
    if not record:
        return None
    last = record[-1]
    again = "then resume with the same --run-name"
    node = failing_node(record, nodes)
    if node and not leave:
        return (
            f"two faults in a row on node {node} (the last: {last['cause']}): not restarting there "
            f"again; cordon it (kubectl cordon {node}) and delete its Ray worker pod so that a node "
            f"replaces it, {again}"
        )
    spent = recovery_spent_s(record)
    if spent >= budget_s:
        return (
            f"{len(record) - 1} restarts spent {spent:.0f} s recovering, --recovery-budget-s "
            f"{budget_s:g}: not restarting after {last['cause']}; fix the cause or raise "
            f"--recovery-budget-s, {again}"
        )
    return None


def restart_line(attempt: Mapping[str, Any], max_failures: int) -> str:
    """Rank 0's console line for a restart, after its first step."""
    of = "" if max_failures < 0 else f" of {max_failures}"
    recovery = attempt["recovery_s"]
    took = "" if recovery is None else f", {recovery:.1f} s to recover"
    lost = attempt["lost_steps"]
    return (
        f"restart {attempt['attempt']}{of} after {attempt['cause']}: resumed from step "
        f"{attempt['resumed_from_step']}, {lost} step{'' if lost == 1 else 's'} lost{took}"
    )


def summary_attempts(record: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The attempts as the run summary holds them (`ATTEMPT_KEYS`)."""
    return [{key: attempt[key] for key in ATTEMPT_KEYS} for attempt in record]


def dumps_record(record: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps(list(record), indent=1).encode()


def loads_record(data: bytes) -> list[dict[str, Any]]:
    record = json.loads(data)
    if not isinstance(record, list):
        raise ValueError(f"{ATTEMPTS_FILE} holds {type(record).__name__}, not a list of attempts")
    return record


class Restarts:
    """The loop's view of the restarts before this attempt (`faults`, the stored record)."""

    def __init__(self, faults: Sequence[Mapping[str, Any]], max_failures: int) -> None:
        self.record = [dict(fault) for fault in faults]
        self.max_failures = max_failures
        self.leaving: str | None = None  # the failing node this attempt waits to see taken out
        self.wait_s = 0.0  # how long: for the node to leave, else the backoff before training

    @classmethod
    def begin(
        cls, faults: Sequence[Mapping[str, Any]], config: TrainConfig, nodes: Sequence[str]
    ) -> Restarts:
        """This attempt's view (`nodes`: each rank's node); raises `RestartRefusedError` where it
        must not train."""
        restarts = cls(faults, config.max_failures)
        problem = restart_refusal(
            restarts.record, budget_s=config.recovery_budget_s, nodes=nodes, leave=config.leave_failing_node
        )
        if problem:
            raise RestartRefusedError(problem)
        restarts.leaving = failing_node(restarts.record, nodes)
        restarts.wait_s = (
            config.recovery_budget_s - recovery_spent_s(restarts.record)
            if restarts.leaving
            else restart_backoff_s(restarts.record)
        )
        return restarts

    def leaving_line(self) -> str:
        """Rank 0's request that the failing node leave the job, for whoever follows it."""
        assert self.leaving is not None
        why = (
            f"two faults in a row on node {self.leaving} (the last: {self.record[-1]['cause']}): "
            f"waiting up to {self.wait_s:.0f} s for it to be cordoned and its Ray worker pod deleted, "
            "then Ray Train restarts on its replacement"
        )
        return format_node_leaving_line(self.leaving, why, self.wait_s)

    def wait(
        self,
        notice: Callable[[], Any],
        emit: Callable[[str], None],
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        """Before training: the backoff, or with a node leaving, rank 0's line (`emit` prints on
        rank 0 only) and a wait for its drain. `notice` is the session's preemption notice, a
        barrier every rank calls alike. The drain's end tears this worker group down and Ray Train
        restarts it; a node nobody takes out within `wait_s` ends the run with the refusal."""
        if self.leaving is None:
            if self.wait_s:
                emit(f"restart waits {self.wait_s:.0f} s: faults in a row named nodes (backoff)")
                sleep(self.wait_s)
            return
        emit(self.leaving_line())
        end, seen = clock() + self.wait_s, False
        while clock() < end:
            if notice() is not None and not seen:
                seen = True
                emit(f"node {self.leaving} is draining: Ray Train restarts the worker group once it is gone")
            sleep(LEAVE_POLL_S)
        raise RestartRefusedError(
            f"node {self.leaving} was not taken out of the job within {self.wait_s:.0f} s (two faults in a "
            f"row there, the last: {self.record[-1]['cause']}); cordon it (kubectl cordon {self.leaving}) "
            "and delete its Ray worker pod, then resume with the same --run-name"
        )

    def first_step(self, start_step: int, now: float, emit: Callable[[str], None]) -> dict[str, Any] | None:
        """After this attempt's first step: its attempt completed from what rank 0 knows (the step
        it resumed from, the time now), its line emitted; None on a run that never restarted."""
        if not self.record:
            return None
        self.record = record_recovery(self.record, first_step=start_step + 1, at=now)
        attempt = self.record[-1]
        emit(restart_line(attempt, self.max_failures))
        return summary_attempts([attempt])[0]

    def summary_fields(self) -> dict[str, Any]:
        """The run summary's `restarts` and `attempts`."""
        return {"restarts": len(self.record), "attempts": summary_attempts(self.record)}
