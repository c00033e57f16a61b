"""What EFA carried during a job, judged from each worker node's EFA counters read before and after it.

NCCL's log lines say which transport NCCL chose; the counters say how much the EFA devices moved
while the job ran. A worker pod cannot see them (its network namespace shows compat devices
without port counters: `training.metrics.efa_sysfs`), so they are read by exec in the EFA counter
reader pod on the worker pod's node (`access.efa_counter_reads`); this module judges them.

A node whose counters cannot be read (no running reader pod on it, an exec that fails, after
the run waited and asked again) is *unavailable*, with the reason: never reported as
counters that did not move, and never a pass either. The reader is part of this stack, so a check
that cannot measure fails, naming the node, the reason and the fix (`efa_problems`); only the stack
key `training.checkEfaCounters: false` turns the counter check off, and the outputs then say so.
A counter never goes down while its device lives; one that did (a driver reload or node reboot
between the two reads) makes the delta unknown rather than negative.

The counters are the node's, not the job's: any EFA user on the node moves them (another job,
connection set-up). So the fabric probe's traffic is held to a floor from its own sizes
(`probe_floor`): a node that moved less than half of what the probe's collectives must bring into
it (`fabric.least_bytes_into_each_node`) fails, as handshakes alone (tens of KiB) do. A TCP
baseline is held to the same floor from above (`tcp_leak_problems`): EFA counters that moved as
much as an EFA run's traffic say the baseline did not run on TCP alone.

The judgement of a job's counters is recorded beside the job (`traffic_record`), so a later
`pulumi up` that finds the finished job judges it by what was measured when it ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.metrics.efa_sysfs import COUNTER_GLOB, MOVED, SYSFS_ROOT, PortCounters


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
    # Worker pods replaced during the job (a lost or failing node's pod and its replacement): read on
    # one side of it only, so their nodes' traffic is not known; the nodes read on both sides are judged.
    replaced: dict[str, str] = field(default_factory=dict)

    def bytes_moved(self) -> dict[str, int | None]:
        """Bytes moved through each node's EFA ports during the job (`MOVED`; None: unknown)."""
        moved: dict[str, int | None] = {
            pod: None if delta is None else _moved(delta) for pod, delta in self.deltas.items()
        }
        return {**moved, **dict.fromkeys(self.unavailable), **dict.fromkeys(self.replaced)}

    def unmeasured(self) -> dict[str, str]:
        """Every worker pod whose node's traffic is not known, and why."""
        return {**self.unavailable, **self.replaced}

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
    """The traffic of each worker pod's node between two reads. Where pods read before the job are
    gone after it and others took their place (KubeRay replaced them: a lost node, a node taken out of
    the job), each is `replaced`, not unavailable: nothing more can be read of it."""
    ports, deltas, unavailable, replaced = {}, {}, {}, {}
    gone, new = [pod for pod in before if pod not in after], [pod for pod in after if pod not in before]
    if gone and new:
        replaced = {
            **dict.fromkeys(gone, "replaced during the job: its node's counters were read before it only"),
            **dict.fromkeys(new, "a replacement during the job: its node's counters were read after it only"),
        }
    for pod in dict.fromkeys([*before, *after]):
        if pod in replaced:
            continue
        first, last = before.get(pod, "not read before the job"), after.get(pod, "not read after the job")
        if isinstance(last, str) or isinstance(first, str):
            unavailable[pod] = last if isinstance(last, str) else str(first)
            continue
        ports[pod] = len(last)
        deltas[pod] = efa_counter_delta(first, last)
    return EfaTraffic(ports, deltas, unavailable, replaced)


def unavailable_traffic(pods: Sequence[str], why: str) -> EfaTraffic:
    return EfaTraffic({}, {}, dict.fromkeys(pods, why))


# The share of the bytes the probe must bring into each node that its EFA counters must show: half,
# which allows for a sum of counters that leaves some verb out, and is still far above what
# connection set-up moves (tens of KiB against GiB).
PROBE_FLOOR_SHARE = 0.5


@dataclass(frozen=True)
class MovedFloor:
    """The least bytes each node's EFA ports must have moved during a run, and what that number is."""

    bytes: int
    basis: str


# The training job's floor: its traffic is not modelled byte for byte, so any traffic at all.
ANY_TRAFFIC = MovedFloor(1, "any traffic at all")


def probe_floor(least_node_bytes: int | None) -> MovedFloor | None:
    """The probe's floor from the bytes its collectives must bring into each node; None: unknown."""
    if least_node_bytes is None:
        return None
    return _share_of(least_node_bytes, "the probe's collectives must bring into each node")


def baseline_floor(efa_run: EfaTraffic) -> MovedFloor | None:
    """The floor a TCP baseline's EFA counters must stay under: the share `PROBE_FLOOR_SHARE` of the
    least a node's EFA ports moved in the EFA run of the same job; None when that run was not read."""
    moved = [bytes_ for bytes_ in efa_run.bytes_moved().values() if bytes_ is not None]
    if efa_run.unavailable or not moved:
        return None
    return _share_of(min(moved), "a node's EFA ports moved in the EFA run of the same job")


def _share_of(least: int, what: str) -> MovedFloor:
    """`PROBE_FLOOR_SHARE` of `least` bytes (at least one byte), saying what `least` is."""
    return MovedFloor(
        max(1, int(least * PROBE_FLOOR_SHARE)), f"{PROBE_FLOOR_SHARE:g} of the {least} bytes {what}"
    )


def _moved(delta: Mapping[str, int]) -> int:
    return sum(delta.get(name, 0) for name in MOVED)


def unread_problems(traffic: EfaTraffic) -> list[str]:
    """One line per worker pod whose node's counters could not be read."""
    return [
        f"{pod}: its node's EFA counters could not be read: {why}" for pod, why in traffic.unavailable.items()
    ]


def efa_problems(traffic: EfaTraffic, floor: MovedFloor) -> list[str]:
    """Why the counters do not show the run's traffic going over EFA, one line per worker pod: a
    node that could not be read, shows no EFA port, was reset, or moved less than `floor`; and a run
    whose every node was replaced during it, so none was read on both sides of it."""
    problems = unread_problems(traffic)
    if traffic.replaced and not traffic.deltas:
        problems.append(
            "no worker node's EFA counters were read both before and after the job: every worker pod was "
            f"replaced during it ({', '.join(traffic.replaced)})"
        )
    for pod, delta in traffic.deltas.items():
        if traffic.ports[pod] == 0:
            problems.append(
                f"{pod}: its node shows no EFA port counters in the host's network namespace "
                f"({SYSFS_ROOT}/{COUNTER_GLOB} is empty there)"
            )
        elif delta is None:
            problems.append(f"{pod}: the EFA counters went down between the reads (device reset)")
        elif (moved := _moved(delta)) < floor.bytes:
            through = f"through its {traffic.ports[pod]} EFA port(s)"
            problems.append(
                f"{pod}: 0 bytes sent or received {through}"
                if floor == ANY_TRAFFIC
                else f"{pod}: {moved} bytes moved {through}, under {floor.bytes} ({floor.basis})"
            )
    return problems


def tcp_leak_problems(traffic: EfaTraffic, floor: MovedFloor) -> list[str]:
    """Why a TCP baseline's counters do not show a run on TCP alone, one line per worker pod: a
    node that could not be read or was reset (nothing can be told), or whose EFA ports moved at
    least `floor`, what an EFA run's traffic would have moved."""
    problems = unread_problems(traffic)
    for pod, delta in traffic.deltas.items():
        if delta is None:
            problems.append(f"{pod}: the EFA counters went down between the reads (device reset)")
        elif (moved := _moved(delta)) >= floor.bytes:
            problems.append(
                f"{pod}: {moved} bytes moved through its EFA port(s), at least {floor.bytes} ({floor.basis})"
            )
    return problems


def counter_problems(traffic: EfaTraffic, expect: str, floor: MovedFloor) -> list[str]:
    """What a run's EFA counters say against the transport it was to use: every node's EFA traffic at
    least `floor` (`efa`), or none that large (`socket`, the TCP baseline); other transports are not
    judged by the EFA counters."""
    if expect == "efa":
        return efa_problems(traffic, floor)
    if expect == "socket":
        return tcp_leak_problems(traffic, floor)
    return []


def traffic_record(traffic: EfaTraffic) -> dict[str, Any]:
    """The traffic as JSON, recorded beside the job it was measured around."""
    return {
        "ports": traffic.ports,
        "deltas": traffic.deltas,
        "unavailable": traffic.unavailable,
        "replaced": traffic.replaced,
    }


def traffic_from_record(record: Mapping[str, Any]) -> EfaTraffic:
    """A recorded traffic; a record of an older release has no `replaced` (or an empty one dropped)."""
    return EfaTraffic(
        dict(record["ports"]),
        dict(record["deltas"]),
        dict(record.get("unavailable") or {}),
        dict(record.get("replaced") or {}),
    )
