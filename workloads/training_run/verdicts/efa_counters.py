"""The EFA hardware counters of each worker node, read before and after a job: what EFA carried.

NCCL's log lines say which transport NCCL chose; the counters say how much the EFA devices moved
while the job ran. Where they are and how they read is `training.metrics.efa_sysfs` (the training job reads
the same files at every step); here they are read by exec in each worker pod, where rdma-core
finds the devices libfabric's EFA provider opens through these very folders.

A counter never goes down while its device lives; one that did (a driver reload or node reboot
between the two reads) makes the delta unknown rather than negative.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from training.metrics.efa_sysfs import (
    COUNTER_GLOB,
    COUNTER_PATH,
    COUNTERS,
    MOVED,
    SYSFS_ROOT,
    port_name,
)
from workloads.training_run.access.kube_access import Executor, PodFacts, stdout_of_each_pod

COUNTERS_SCRIPT = f"""\
cd "$1" 2>/dev/null || exit 0
shift
for name in "$@"; do
  for file in {COUNTER_GLOB}/"$name"; do
    [ -f "$file" ] && echo "$file $(cat "$file")"
  done
done
exit 0
"""
_LINE = re.compile(COUNTER_PATH.pattern + r" (\d+)")


def counters_command(sysfs_root: str = SYSFS_ROOT) -> list[str]:
    return ["sh", "-c", COUNTERS_SCRIPT, "sh", sysfs_root, *COUNTERS]


def parse_counters(stdout: str) -> dict[str, dict[str, int]]:
    """`<device>/ports/<port>/hw_counters/<name> <value>` lines -> {`<device>/<port>`: {name: value}}."""
    found: dict[str, dict[str, int]] = {}
    for line in stdout.splitlines():
        if match := _LINE.fullmatch(line.strip()):
            device, port, name, value = match.groups()
            found.setdefault(port_name(device, port), {})[name] = int(value)
    return found


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
    """Per worker pod: how many EFA ports it sees, and what they counted during the job (None:
    unknown, the counters were reset between the reads)."""

    ports: dict[str, int]
    deltas: dict[str, dict[str, int] | None]

    def bytes_moved(self) -> dict[str, int | None]:
        """Bytes sent plus received through each node's EFA ports during the job."""
        return {
            pod: None if delta is None else sum(delta.get(name, 0) for name in MOVED)
            for pod, delta in self.deltas.items()
        }


def efa_traffic(
    before: Mapping[str, Mapping[str, Mapping[str, int]]],
    after: Mapping[str, Mapping[str, Mapping[str, int]]],
) -> EfaTraffic:
    """The traffic of each pod read both times (pod -> parsed counters)."""
    pods = [pod for pod in after if pod in before]
    return EfaTraffic(
        {pod: len(after[pod]) for pod in pods},
        {pod: efa_counter_delta(before[pod], after[pod]) for pod in pods},
    )


def efa_problems(traffic: EfaTraffic) -> list[str]:
    """Why the counters do not show the job's traffic going over EFA, one line per worker pod."""
    problems = []
    for pod, moved in traffic.bytes_moved().items():
        if traffic.ports[pod] == 0:
            problems.append(f"{pod}: no EFA port counters under {SYSFS_ROOT}/{COUNTER_GLOB}")
        elif moved is None:
            problems.append(f"{pod}: the EFA counters went down between the reads (device reset)")
        elif moved == 0:
            problems.append(f"{pod}: 0 bytes sent or received through its {traffic.ports[pod]} EFA port(s)")
    return problems


def read_counters(
    workers: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor], sysfs_root: str = SYSFS_ROOT
) -> dict[str, dict[str, dict[str, int]]]:
    """Each worker pod's EFA port counters, now."""
    listings = stdout_of_each_pod(
        workers, executor_for, counters_command(sysfs_root), f"the EFA counters in {sysfs_root}"
    )
    return {name: parse_counters(stdout) for name, stdout in listings.items()}
