"""Each node's EFA traffic during the run: the bytes its EFA ports moved between two logged steps.

The TrainingRun reads the counters around the whole job; this says when they moved. The first
rank of each node (the lowest rank on its host, local rank 0 under both launchers) reads the
node's counters when the loop starts and after every step (`training.metrics.efa_sysfs`: on EKS
from the node's counter server, as a pod's own sysfs holds none), and one
all-reduce of two numbers per node (bytes, seconds, each on the reading rank's own clock) brings
them to rank 0, which logs them beside tokens/s. Without EFA ports on any node (CPU, `--local`, a
machine without EFA) there is no meter: the fields are absent, not zero.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from training.metrics.efa_sysfs import counters_source, read_moved_bytes

UNKNOWN = -1.0  # a node without EFA ports, or whose counters went down (a device reset)

# Per node (its host name): bytes moved and seconds since the last sample, None when unknown.
EfaSample = dict[str, tuple[float, float] | None]


class EfaMeter:
    """Collective: every rank calls `sample` at the same points; rank 0 gets the sample."""

    def __init__(self, hosts: list[str], slot: int | None, source: str, device: torch.device) -> None:
        self.hosts, self.slot, self.source, self.device = hosts, slot, source, device
        self.last = self._read()

    @classmethod
    def start(cls, device: torch.device, source: str | None = None) -> EfaMeter | None:
        """The meter of this run, or None on every rank when no node has EFA port counters."""
        source = source or counters_source()
        facts: list[tuple[str, bool] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(facts, (socket.gethostname(), bool(read_moved_bytes(source))))
        known = [fact for fact in facts if fact is not None]
        if not any(has_ports for _, has_ports in known):
            return None
        hosts = list(dict.fromkeys(host for host, _ in known))  # by their first rank
        first_ranks = {
            host: next(rank for rank, fact in enumerate(known) if fact[0] == host) for host in hosts
        }
        host = socket.gethostname()
        slot = hosts.index(host) if first_ranks[host] == dist.get_rank() else None
        return cls(hosts, slot, source, device)

    def _read(self) -> tuple[int | None, float]:
        if self.slot is None:
            return None, 0.0
        ports = read_moved_bytes(self.source)
        return (sum(ports.values()) if ports else None), time.perf_counter()

    def sample(self) -> EfaSample | None:
        """What each node moved since the last sample (rank 0; None on the other ranks)."""
        values = torch.zeros(2 * len(self.hosts), dtype=torch.float64, device=self.device)
        if self.slot is not None:
            (before, then), (now_bytes, now) = self.last, self._read()
            self.last = (now_bytes, now)
            moved = (
                UNKNOWN if before is None or now_bytes is None or now_bytes < before else now_bytes - before
            )
            values[2 * self.slot] = moved
            values[2 * self.slot + 1] = now - then
        dist.all_reduce(values)
        if dist.get_rank() != 0:
            return None
        pairs = values.tolist()
        return {
            host: None if pairs[2 * index] < 0 else (pairs[2 * index], pairs[2 * index + 1])
            for index, host in enumerate(self.hosts)
        }
