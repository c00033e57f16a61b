"""Every restart of a run recorded: its cause, the node, the steps it lost and the seconds it took.

Ray Train restarts a failed worker group from the latest checkpoint (`--max-failures`). Its
controller outlives the workers, so a callback there (`training.launch.attempt_store.AttemptRecorder`)
writes each fault to `ATTEMPTS_FILE` in the run's storage folder; the restarted rank 0 reads it back
(`Session.faults`), refuses a restart that cannot help, prints one line per restart after its first
step and puts the attempts in the run summary. Everything here is plain Python over those records.

An attempt (the run summary's `attempts`, in this order) is `ATTEMPT_KEYS`: its number (1 = the
first restart), the cause (one line), the node of the failed worker where known, the last step every
rank finished before the fault, the checkpoint's step it resumed from, the steps between the two, and
the seconds from the fault's detection to the first step finished after the restart (None while, or
if never, one finished). The stored record adds `DETECTED_AT` (Unix seconds, the controller's clock).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.config.run_config import TrainConfig
from training.errors import RestartRefusedError
from training.metrics.report import ATTEMPT_KEYS

# In the run's folder beside its checkpoints (`<storage-path>/<run-name>/`), on any filesystem Ray
# Train stores to (s3:// on a cluster).
ATTEMPTS_FILE = "attempts.json"
DETECTED_AT = "detected_at"
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


@dataclass(frozen=True)
class WorkerError:
    """One worker's error as the controller saw it."""

    rank: int
    died: bool  # its process or node is gone (Ray's RayActorError), not an exception it raised
    kind: str  # the exception's type name
    message: str


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


def _silent_node(errors: Sequence[WorkerError], hosts: Mapping[int, str]) -> tuple[list[int], str | None]:
    """Where every error is a lost peer: the ranks that reported nothing (`hosts` knows every rank
    that ever reported), and their node where they share one."""
    silent = sorted(set(hosts) - {error.rank for error in errors})
    nodes = {hosts[rank] for rank in silent}
    return silent, (nodes.pop() if len(nodes) == 1 else None)


def _and_others(count: int) -> str:
    return f" (and {count} other rank{'s' if count > 1 else ''})" if count else ""


def _cut(line: str) -> str:
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


def fault_cause(errors: Sequence[WorkerError], hosts: Mapping[int, str]) -> tuple[str, str | None]:
    """One line naming what failed, and the node it ran on where known. A worker whose process died
    comes first: the errors of the others are what its death did to their collectives. Where the
    others' errors came alone, the ranks gone silent are the fault, on their node; where no rank
    went silent, or they ran on several nodes, the node is unknown."""
    first = min(errors, key=lambda error: (not error.died, lost_a_peer(error), error.rank))
    why = _why(first)
    report = f"{first.kind}" + (f": {why}" if why else "")
    where = f"rank {first.rank}" + (f" on {hosts[first.rank]}" if first.rank in hosts else "")
    if all(map(lost_a_peer, errors)):
        silent, node = _silent_node(errors, hosts)
        if silent and node:
            gone = f"rank {silent[0]} on {node}{_and_others(len(silent) - 1)}"
            return _cut(f"{gone} stopped answering; {where} lost it: {report}"), node
        return _cut(f"{where} lost a peer: {report}"), None
    what = "died" if first.died else "raised"
    return _cut(f"{where} {what}{_and_others(len(errors) - 1)}: {report}"), hosts.get(first.rank)


def record_fault(
    record: Sequence[Mapping[str, Any]],
    *,
    cause: str,
    node: str | None,
    failed_after_step: int,
    resumed_from_step: int,
    detected_at: float,
) -> list[dict[str, Any]]:
    """The record with one more attempt: the restart Ray Train makes after this fault, from the
    latest checkpoint (`resumed_from_step`, which the restarted rank 0 confirms)."""
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


def restart_refusal(record: Sequence[Mapping[str, Any]], *, budget_s: float, one_node: bool) -> str | None:
    """Why the restart now starting must not train (one line with the fix), or None. A fault on the
    node of the fault before it (the run's only node aside) would recur there; a run whose earlier
    recoveries spent --recovery-budget-s gets no more. Judged from the record alone, so every rank
    decides alike. A diverged loss is never retried at all (`training.errors.DivergedError`)."""
    if not record:
        return None
    last = record[-1]
    again = "then resume with the same --run-name"
    if len(record) >= 2 and not one_node and last["node"] and last["node"] == record[-2]["node"]:
        return (
            f"two faults in a row on node {last['node']} (the last: {last['cause']}): not restarting "
            f"there again; cordon it (kubectl cordon {last['node']}) so the node group replaces it, {again}"
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

    @classmethod
    def begin(cls, faults: Sequence[Mapping[str, Any]], config: TrainConfig, one_node: bool) -> Restarts:
        """This attempt's view; raises `RestartRefusedError` where it must not train."""
        restarts = cls(faults, config.max_failures)
        problem = restart_refusal(restarts.record, budget_s=config.recovery_budget_s, one_node=one_node)
        if problem:
            raise RestartRefusedError(problem)
        return restarts

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
