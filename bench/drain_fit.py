"""A drain's checkpoint against its grace at the cluster's sizes, on the CPU: bytes written through a
rate limit (a thousandth of them, at a thousandth of the rate, so the seconds are the cluster's and
the memory is not), each phase run for real, with a periodic write just begun when the notice
comes and with none.

Two paths, the size, the rates, the step and the grace as parameters:

- `direct` (this release): each of a node's ranks writes its share straight to S3, one stream each
  at `--stream-rate`; the notice's choice is the job's own (`training.config.drain_budget.drain_choice`),
  and the grace is the one the preview sets (`drain_budget(...).grace_s`) unless `--grace` names one;
- `staged` (the path it replaces): the node's shards fsynced to the root volume at `--local-rate`
  (one gp3 volume: 125 MiB/s baseline), then uploaded by its ranks at `--stream-rate` each, and a
  write in flight committed (both copies) before the drain's own write starts.

The drain commits in time when its commit ends before the drain's deadline (the grace less Ray's
stop). `--time-scale S` runs every phase S times faster and reports the cluster's seconds.

    python -m bench.drain_fit --out bench/reports/drain-fit_cpu_YYYYMM/drain-fit.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from training.config.drain_budget import (
    COMMIT_S,
    NOTICE_S,
    RAY_STOP_MARGIN_S,
    STAGE_BYTES_PER_S,
    STREAM_BYTES_PER_S,
    drain_budget,
    drain_choice,
)

GIB = 1 << 30
MIB = 1 << 20
BYTE_SCALE = 1000  # bytes written per byte of the cluster's, and the rates with them
CHUNK = 64 << 10


@dataclass(frozen=True)
class Scenario:
    path: str  # "direct" or "staged"
    bytes_per_node: float
    ranks: int
    stream_rate: float  # bytes/s of one rank's upload
    local_rate: float  # bytes/s of the node's root volume (staged path)
    step_s: float
    grace_s: float
    in_flight: bool


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    deadline_s: float  # from the notice's start (the SIGTERM) to Ray's drain deadline
    choice: str  # what the notice did
    committed_at_s: float | None  # when the drain's checkpoint committed, from the SIGTERM
    committed_step: str  # "in flight", "drain", or "none"
    fits: bool


class _Clock:
    def __init__(self, time_scale: float) -> None:
        self.scale, self.start = time_scale, time.monotonic()

    def now(self) -> float:
        """The cluster's seconds since the clock started."""
        return (time.monotonic() - self.start) * self.scale

    def sleep(self, cluster_s: float) -> None:
        time.sleep(max(0.0, cluster_s) / self.scale)


def _throttled_write(
    folder: str, name: str, cluster_bytes: float, cluster_rate: float, clock: _Clock
) -> None:
    """`cluster_bytes / BYTE_SCALE` bytes written to a file at `cluster_rate / BYTE_SCALE` bytes a
    cluster second, in chunks, fsynced: the bytes flow, the seconds are the cluster's."""
    size = int(cluster_bytes / BYTE_SCALE)
    rate = cluster_rate / BYTE_SCALE
    started = clock.now()
    written = 0
    with open(os.path.join(folder, name), "wb") as handle:
        while written < size:
            piece = min(CHUNK, size - written)
            handle.write(b"\0" * piece)
            written += piece
            clock.sleep(started + written / rate - clock.now())
        handle.flush()
        os.fsync(handle.fileno())


def _write(scenario: Scenario, folder: str, label: str, clock: _Clock) -> None:
    """One checkpoint of the node, start to end: its ranks' streams at once (direct), or the volume's
    fsync then the upload (staged)."""
    share = scenario.bytes_per_node / scenario.ranks
    clock.sleep(scenario.bytes_per_node / scenario.ranks / STAGE_BYTES_PER_S)  # the copy to CPU memory
    if scenario.path == "staged":
        _throttled_write(folder, f"{label}-volume", scenario.bytes_per_node, scenario.local_rate, clock)
    streams = [
        threading.Thread(
            target=_throttled_write, args=(folder, f"{label}-{rank}", share, scenario.stream_rate, clock)
        )
        for rank in range(scenario.ranks)
    ]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.join()


def run_scenario(scenario: Scenario, time_scale: float) -> Outcome:
    clock = _Clock(time_scale)
    deadline = scenario.grace_s - RAY_STOP_MARGIN_S
    budget = drain_budget(
        round(scenario.bytes_per_node / 12), 1, scenario.ranks, scenario.step_s, scenario.stream_rate
    )
    with tempfile.TemporaryDirectory(prefix="drain-fit-") as folder:
        in_flight = None
        if scenario.in_flight:  # the periodic write, begun at the SIGTERM
            in_flight = threading.Thread(target=_write, args=(scenario, folder, "periodic", clock))
            in_flight.start()
        clock.sleep(NOTICE_S + scenario.step_s)  # the notice reaches the loop; the step ends
        if scenario.path == "direct":
            left = deadline - clock.now()
            in_flight_left = max(0.0, budget.stage_s + budget.write_s - clock.now()) if in_flight else None
            choice = drain_choice(left, in_flight_left, budget.stage_s + budget.write_s)
            if choice.commit_in_flight and in_flight is not None:
                in_flight.join()
                clock.sleep(COMMIT_S)
                return _outcome(scenario, deadline, "commit the write in flight", clock.now(), "in flight")
            if choice.write:
                _write(scenario, folder, "drain", clock)
                clock.sleep(COMMIT_S)
                return _outcome(scenario, deadline, "write the step in progress", clock.now(), "drain")
            if in_flight is not None:
                in_flight.join()  # dropped: it ends on its own, uncommitted
            return _outcome(scenario, deadline, "nothing can commit", None, "none")
        # staged: the write in flight is committed first, then the drain's own is written
        if in_flight is not None:
            in_flight.join()
            clock.sleep(COMMIT_S)
        _write(scenario, folder, "drain", clock)
        clock.sleep(COMMIT_S)
        done = (
            "commit the write in flight, then write the step" if in_flight else "write the step in progress"
        )
        return _outcome(scenario, deadline, done, clock.now(), "drain")


def _outcome(scenario: Scenario, deadline: float, choice: str, at: float | None, step: str) -> Outcome:
    fits = at is not None and at <= deadline
    return Outcome(scenario, deadline, choice, None if at is None else round(at, 1), step, fits)


def scenarios(
    bytes_per_node: float,
    ranks: int,
    stream_rate: float,
    local_rate: float,
    step_s: float,
    grace_s: float | None,
) -> list[Scenario]:
    """The direct path at the preview's grace (or `grace_s`), and the staged one at its 120 s grace,
    each with a write in flight and without."""
    budget = drain_budget(round(bytes_per_node / 12), 1, ranks, step_s, stream_rate)
    direct_grace = grace_s if grace_s is not None else float(budget.grace_s)
    return [
        Scenario(path, bytes_per_node, ranks, stream_rate, local_rate, step_s, grace, in_flight)
        for path, grace in (("direct", direct_grace), ("staged", 120.0))
        for in_flight in (False, True)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--bytes-per-node", type=float, default=9 * GIB, help="a node's checkpoint (9 GiB)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks a node, each one stream")
    parser.add_argument("--stream-rate", type=float, default=STREAM_BYTES_PER_S, help="bytes/s of one stream")
    parser.add_argument("--local-rate", type=float, default=125 * MIB, help="bytes/s of the root volume")
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument(
        "--grace", type=float, default=None, help="the direct path's grace (default: the preview's)"
    )
    parser.add_argument("--time-scale", type=float, default=10.0)
    args = parser.parse_args(argv)
    results = [
        asdict(run_scenario(scenario, args.time_scale))
        for scenario in scenarios(
            args.bytes_per_node, args.ranks, args.stream_rate, args.local_rate, args.step_s, args.grace
        )
    ]
    report = {
        "command": " ".join(
            shlex.quote(part) for part in [sys.executable, "-m", "bench.drain_fit", *(argv or sys.argv[1:])]
        ),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "byte_scale": BYTE_SCALE,
        "time_scale": args.time_scale,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    for result in results:
        scenario = result["scenario"]
        print(
            f"{scenario['path']:6} in flight {scenario['in_flight']!s:5} grace {scenario['grace_s']:5.0f} s: "
            f"{result['choice']}, committed at {result['committed_at_s']} s of {result['deadline_s']:.0f} s "
            f"-> {'fits' if result['fits'] else 'does not fit'}"
        )


if __name__ == "__main__":
    main()
