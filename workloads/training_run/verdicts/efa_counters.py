"""The EFA hardware counters of each worker node, read before and after a job: what EFA carried.

NCCL's log lines say which transport NCCL chose; the counters say how much the EFA devices moved
while the job ran. A worker pod cannot see them (its network namespace shows compat devices
without port counters: `training.metrics.efa_sysfs`), so they are read by exec in the EFA counter
reader pod on the worker pod's node (`workloads.efa_counter_reader`, `hostNetwork`), matched by
node name.

A node whose counters cannot be read (no Ready reader pod on it, an exec that fails) is
*unavailable*, with the reason: that says nothing of the fabric, so it is never reported as
counters that did not move. A counter never goes down while its device lives; one that did (a
driver reload or node reboot between the two reads) makes the delta unknown rather than negative.

The judgement of a job's counters is recorded beside the job (`traffic_record`), so a later
`pulumi up` that finds the finished job judges it by what was measured when it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.metrics.efa_sysfs import COUNTER_GLOB, MOVED, SYSFS_ROOT, PortCounters, parse_counters
from workloads.efa_counter_reader import READER_NAME, READER_NAMESPACE, READER_SELECTOR, counters_command
from workloads.training_run.access.cluster_api import ClusterApi, PodFacts
from workloads.training_run.access.commands import COMMAND_TIMEOUT_S, CommandTimeout, Executor
from workloads.training_run.errors import ApiRefused, ExecStreamCut, PodGone

# Per worker pod: its node's counters, or why they could not be read.
Readings = dict[str, PortCounters | str]


def efa_counter_delta(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> dict[str, int] | None:
    """What one node's EFA ports counted between two reads, summed over its ports; None when a
    port present after was absent before or a counter went down (the device was reset)."""
    total: dict[str, int] = {}
    for port, counts in after.items():
        if port not in before:
            return None
        for name, value in counts.items():
            if name not in before[port] or value < before[port][name]:
                return None
            total[name] = total.get(name, 0) + value - before[port][name]
    return total


@dataclass(frozen=True)
class EfaTraffic:
    """Per worker pod: how many EFA ports its node shows, what they counted during the job (None:
    unknown, the counters were reset between the reads), and, for a node whose counters could not
    be read, why (`unavailable`)."""

    ports: dict[str, int]
    deltas: dict[str, dict[str, int] | None]
    unavailable: dict[str, str] = field(default_factory=dict)

    def bytes_moved(self) -> dict[str, int | None]:
        """Bytes sent plus received through each node's EFA ports during the job (None: unknown)."""
        moved: dict[str, int | None] = {
            pod: None if delta is None else sum(delta.get(name, 0) for name in MOVED)
            for pod, delta in self.deltas.items()
        }
        return {**moved, **dict.fromkeys(self.unavailable)}

    def unavailable_note(self) -> str | None:
        """One line naming the nodes whose counters were not read, and why; None when all were."""
        if not self.unavailable:
            return None
        return "EFA counters unavailable for " + "; ".join(
            f"{pod}: {why}" for pod, why in self.unavailable.items()
        )


def efa_traffic(
    before: Mapping[str, PortCounters | str], after: Mapping[str, PortCounters | str]
) -> EfaTraffic:
    """The traffic of each worker pod's node between two reads."""
    ports, deltas, unavailable = {}, {}, {}
    for pod in dict.fromkeys([*before, *after]):
        first, last = before.get(pod, "not read before the job"), after.get(pod, "not read after the job")
        if isinstance(last, str) or isinstance(first, str):
            unavailable[pod] = last if isinstance(last, str) else str(first)
            continue
        ports[pod] = len(last)
        deltas[pod] = efa_counter_delta(first, last)
    return EfaTraffic(ports, deltas, unavailable)


def unavailable_traffic(pods: Sequence[str], why: str) -> EfaTraffic:
    return EfaTraffic({}, {}, dict.fromkeys(pods, why))


def efa_problems(traffic: EfaTraffic) -> list[str]:
    """Why the counters that were read do not show the job's traffic going over EFA, one line per
    worker pod; nodes whose counters were unavailable are not judged."""
    problems = []
    for pod, delta in traffic.deltas.items():
        if traffic.ports[pod] == 0:
            problems.append(
                f"{pod}: its node shows no EFA port counters in the host's network namespace "
                f"({SYSFS_ROOT}/{COUNTER_GLOB} is empty there)"
            )
        elif delta is None:
            problems.append(f"{pod}: the EFA counters went down between the reads (device reset)")
        elif sum(delta.get(name, 0) for name in MOVED) == 0:
            problems.append(f"{pod}: 0 bytes sent or received through its {traffic.ports[pod]} EFA port(s)")
    return problems


def traffic_record(traffic: EfaTraffic) -> dict[str, Any]:
    """The traffic as JSON, recorded beside the job it was measured around."""
    return {"ports": traffic.ports, "deltas": traffic.deltas, "unavailable": traffic.unavailable}


def traffic_from_record(record: Mapping[str, Any]) -> EfaTraffic:
    return EfaTraffic(dict(record["ports"]), dict(record["deltas"]), dict(record.get("unavailable") or {}))


def reader_pods(cluster: ClusterApi) -> dict[str, PodFacts]:
    """The Ready reader pod of each node, by node name."""
    return {
        pod.node_name: pod
        for pod in cluster.list_pods(READER_NAMESPACE, READER_SELECTOR)
        if pod.ready and not pod.terminating and pod.node_name
    }


def missing_readers(cluster: ClusterApi, workers: Sequence[PodFacts]) -> list[str]:
    """The worker pods whose node has no Ready reader pod (yet)."""
    readers = reader_pods(cluster)
    return [worker.name for worker in workers if worker.node_name not in readers]


def read_counters(
    cluster: ClusterApi, workers: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor]
) -> Readings:
    """Each worker pod's node's EFA port counters now, read by its node's reader pod; or why not."""
    readers = reader_pods(cluster)
    found: Readings = {}
    for worker in workers:
        reader = readers.get(worker.node_name or "")
        if reader is None:
            found[worker.name] = (
                f"no Ready {READER_NAME} pod on node {worker.node_name} "
                f"(`kubectl -n {READER_NAMESPACE} get pods -o wide`)"
            )
            continue
        try:
            result = executor_for(reader).run(counters_command(), COMMAND_TIMEOUT_S)
        except (PodGone, ExecStreamCut, CommandTimeout, ApiRefused) as error:
            found[worker.name] = f"reading them in {READER_NAMESPACE}/{reader.name} failed: {error}"
            continue
        if result.returncode != 0:
            found[worker.name] = (
                f"reading them in {READER_NAMESPACE}/{reader.name} failed (exit {result.returncode}): "
                f"{result.output[-300:]}"
            )
            continue
        found[worker.name] = parse_counters(result.stdout)
    return found
