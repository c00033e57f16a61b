"""The hang watchdog's NCCL path on one GPU: what it reads of ProcessGroupNCCL's flight recorder, and
its exit.

1. Initialises the process group with the flight recorder on (TORCH_FR_BUFFER_SIZE, 2000 where
   unset), runs a few all_reduces, then reads the NCCL recorder through the watchdog's own
   functions (`read_nccl_recorder`, `training_group_id`, `training_collectives`, `oldest_pending`):
   the training group's uid, its last enqueued and completed collective, the collectives not
   completed. On a GPU it does so while an all_reduce waits behind a kernel that spins for about a
   second (one pending collective), and again after it completed; it checks the status's sequence
   numbers against the entries of a full dump (the highest `collective_seq_id` recorded and
   completed on the default group), and times the reads (the status one is made every second).
2. Runs a child process (its own one-rank group) whose watchdog has a small limit (three quick
   steps, `--margin-s`) around a step that stalls past it: on a GPU, an all_reduce queued behind a
   spinning kernel whose result the host waits for, as a wedged GPU holds `loss_and_grad_norm`; on
   gloo, a sleep. The child must print the hang line and exit with HANG_EXIT_CODE; the report keeps
   the line, the exit code and the time to it.

    torchrun --standalone --nproc-per-node 1 -m bench.nccl_hang_read --out bench/reports/nccl-hang-read_h100_YYYYMM/nccl-hang-read.json

`--backend gloo` runs it on the CPU (no torchrun needed): the NCCL recorder reads are empty there
(the CPU wheel has no `_dump_nccl_trace_json`; a CUDA wheel's holds nothing of a gloo group). The
exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.components.watchdog import (
    FR_BUFFER_ENV,
    HANG_EXIT_CODE,
    TICK_S,
    HangWatchdog,
    oldest_pending,
    read_nccl_recorder,
    training_collectives,
    training_group_id,
)

DEFAULT_GROUP_DESC = "default_pg"  # init_process_group's description of the default group
QUICK_STEPS = 3
STALL_S = 20.0  # the hanging step's stall: far past its limit
CHILD_TIMEOUT_S = 120.0
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _init(backend: str, port: int | None) -> torch.device:
    """A one-rank group: torchrun's (env://) where it launched this, else its own on `port`."""
    os.environ.setdefault(FR_BUFFER_ENV[0], "2000")  # before the recorder is built (its first use)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if port is None and "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    else:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port or _free_port()}",
            rank=0,
            world_size=1,
            device_id=device if backend == "nccl" else None,
        )
    return device


def _spin_cycles(seconds: float) -> int:
    """GPU clock cycles `torch.cuda._sleep` spins for about `seconds`, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return int(cycles * seconds * 1000 / max(start.elapsed_time(end), 1e-3))


def _entries_view(backend: str) -> dict[str, Any] | None:
    """A full dump's (every entry, completed or not) default-group numbers, to check the status's."""
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace_json", None)
    if dump is None or backend != "nccl":
        return None
    full = json.loads(dump(includeCollectives=True, onlyActive=False))
    mine = [
        e
        for e in full.get("entries") or []
        if (e.get("process_group") or [None, None])[1] == DEFAULT_GROUP_DESC
    ]
    completed = [e["collective_seq_id"] for e in mine if e.get("state") == "completed"]
    return {
        "entries": len(full.get("entries") or []),
        "default_group_pg_ids": sorted({e.get("pg_id") for e in mine}),
        "highest_recorded_seq": max((e["collective_seq_id"] for e in mine), default=None),
        "highest_completed_seq": max(completed, default=None),
        "states": sorted({e.get("state") for e in mine}),
        "pg_status": full.get("pg_status"),
        "version": full.get("version"),
        "comm_lib_version": full.get("comm_lib_version"),
    }


def _read(group_id: int | None) -> dict[str, Any]:
    """What the watchdog reads: the status (every second) and the collectives not completed."""
    status, active = read_nccl_recorder(entries=False), read_nccl_recorder(entries=True)
    collectives = None if group_id is None else training_collectives(status, group_id)
    return {
        "status_read": status is not None,
        "last_enqueued_seq": None if collectives is None else collectives.enqueued,
        "last_completed_seq": None if collectives is None else collectives.completed,
        "pending_entries": len((active or {}).get("entries") or []),
        "oldest_pending": oldest_pending(active),
    }


def _median_s(call: Any, times: int) -> float:
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        spent.append(time.perf_counter() - start)
    return statistics.median(spent)


def _reads(backend: str, device: torch.device) -> dict[str, Any]:
    tensor = torch.ones(1024, device=device)
    for _ in range(4):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    time.sleep(0.5)  # ProcessGroupNCCL's watchdog marks the works completed
    group_id = training_group_id()
    result: dict[str, Any] = {"group_id": group_id, "after_all_reduces": _read(group_id)}
    result["after_all_reduces"]["full_dump"] = _entries_view(backend)
    if device.type == "cuda":
        torch.cuda._sleep(_spin_cycles(1.5))  # the all_reduce's stream waits behind it
        work = dist.all_reduce(tensor, async_op=True)
        time.sleep(0.3)
        result["one_pending"] = _read(group_id)
        result["one_pending"]["full_dump"] = _entries_view(backend)
        assert work is not None
        work.wait()
        torch.cuda.synchronize(device)
        time.sleep(0.5)
        result["after_it_completed"] = _read(group_id)
        for _ in range(2100):  # a full ring buffer, for the full dump's time
            dist.all_reduce(tensor)
        torch.cuda.synchronize(device)
        time.sleep(0.5)
        dump = torch._C._distributed_c10d._dump_nccl_trace_json  # type: ignore[attr-defined]
        result["read_s"] = {
            "status_median": _median_s(lambda: read_nccl_recorder(entries=False), 100),
            "not_completed_median": _median_s(lambda: read_nccl_recorder(entries=True), 20),
            "full_buffer_median": _median_s(
                lambda: json.loads(dump(includeCollectives=True, onlyActive=False)), 5
            ),
        }
    return result


def _child(backend: str, port: int, margin_s: float) -> None:
    """Quick steps, then one that stalls past its limit: the watchdog prints its line and exits."""
    device = _init(backend, port)
    watchdog = HangWatchdog.start(0, 1, margin_s, emit=lambda line: print(line, flush=True))
    tensor = torch.ones(1024, device=device)
    for step in range(1, QUICK_STEPS + 1):
        with watchdog.step(step):
            dist.all_reduce(tensor)
            tensor.sum().item()
    time.sleep(2 * TICK_S + 1.0)  # a read of the NCCL sequence numbers at least, between steps
    print(f"stalling step {QUICK_STEPS + 1} at {time.time():.3f}", flush=True)
    with watchdog.step(QUICK_STEPS + 1):
        if device.type == "cuda":
            torch.cuda._sleep(_spin_cycles(STALL_S))
            dist.all_reduce(tensor)  # queued behind the spinning kernel: pending in the recorder
            tensor.sum().item()  # the host waits in a CUDA sync, as in loss_and_grad_norm
        else:
            dist.all_reduce(tensor)
            time.sleep(STALL_S)
    print("the stalled step ended: no hang was found", flush=True)
    sys.exit(0)


def _hang(backend: str, margin_s: float) -> dict[str, Any]:
    # Not torchrun's rank: its variables (TORCHELASTIC_USE_AGENT_STORE above all) would make the
    # child's rendezvous wait on the agent's store.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in TORCHRUN_ENV and not key.startswith("TORCHELASTIC_")
    }
    env.setdefault(FR_BUFFER_ENV[0], "2000")
    command = [sys.executable, "-m", "bench.nccl_hang_read", "--child", "--backend", backend]
    command += ["--port", str(_free_port()), "--margin-s", str(margin_s), "--out", os.devnull]
    started = time.time()
    try:
        child = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S, check=False
        )
        code, out, err = child.returncode, child.stdout, child.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = None, str(expired.stdout or ""), str(expired.stderr or "")
    lines = out.splitlines()
    line = next((text for text in lines if text.startswith("hang at step")), None)
    stalled = next((float(text.split()[-1]) for text in lines if text.startswith("stalling step")), None)
    return {
        "exit_code": code,
        "expected_exit_code": HANG_EXIT_CODE,
        "line": line,
        "seconds_from_stall_to_exit": None if stalled is None else round(time.time() - stalled, 2),
        "seconds_in_all": round(time.time() - started, 2),
        "stacks_dumped": "Thread 0x" in err or "Current thread" in err,
        "stdout_tail": lines[-5:],
        "stderr_tail": err.splitlines()[-15:],
    }


def _checks(backend: str, reads: dict[str, Any], hang: dict[str, Any]) -> dict[str, bool]:
    checks = {
        "exits_with_hang_exit_code": hang["exit_code"] == HANG_EXIT_CODE,
        "prints_the_hang_line": hang["line"] is not None,
    }
    if backend != "nccl":
        after = reads["after_all_reduces"]
        checks["nccl_recorder_read_is_empty"] = (
            not after["status_read"] and after["pending_entries"] == 0 and after["last_completed_seq"] is None
        )
        return checks
    after, pending, done = reads["after_all_reduces"], reads["one_pending"], reads["after_it_completed"]
    full = after["full_dump"] or {}
    checks.update(
        {
            "group_id_is_the_default_groups_pg_id": full.get("default_group_pg_ids") == [reads["group_id"]],
            "status_completed_matches_the_entries": after["last_completed_seq"]
            == full.get("highest_completed_seq"),
            "status_enqueued_matches_the_entries": after["last_enqueued_seq"]
            == full.get("highest_recorded_seq"),
            "a_pending_all_reduce_is_named": (pending["oldest_pending"] or "").startswith("nccl:all_reduce"),
            "pending_enqueued_leads_completed": (
                pending["last_enqueued_seq"] is not None
                and pending["last_completed_seq"] is not None
                and pending["last_enqueued_seq"] > pending["last_completed_seq"]
            ),
            "completed_catches_up": done["last_completed_seq"] == done["last_enqueued_seq"],
            "the_line_names_the_pending_collective": "nccl:all_reduce" in (hang["line"] or ""),
        }
    )
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="the JSON report's path")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--margin-s", type=float, default=0.5, help="the hanging child's --hang-margin-s")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.backend, args.port, args.margin_s)
        return 0
    device = _init(args.backend, None)
    try:
        reads = _reads(args.backend, device)
    finally:
        dist.destroy_process_group()
    hang = _hang(args.backend, args.margin_s)
    checks = _checks(args.backend, reads, hang)
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    launcher = "torchrun --standalone --nproc-per-node 1 " if torchrun else "python "
    launcher += "-m bench.nccl_hang_read "
    report = {
        "command": launcher + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": str(torch.cuda.nccl.version()) if args.backend == "nccl" else None,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "python": platform.python_version(),
        "backend": args.backend,
        "env": {name: os.environ.get(name) for name in (*FR_BUFFER_ENV, "TORCH_NCCL_ASYNC_ERROR_HANDLING")},
        "reads": reads,
        "hang": hang,
        "checks": checks,
        "ok": all(checks.values()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"checks": checks, "hang_line": hang["line"], "reads": reads}, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
