"""A run whose storage is S3, as on the cluster (`--storage-path s3://...`), against a real S3 API
(moto's server, tests/harness/s3_server.py) reached through `AWS_ENDPOINT_URL`: its checkpoints are
objects under the run's prefix, written once; a killed worker's restart resumes from S3 reading each
rank's shards by byte range, not the checkpoint downloaded to every worker; a checkpoint whose shard
upload is refused is never registered, and the next run resumes from the newest whole one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.harness.cli_runs import REPO_ROOT, RUN_TIMEOUT_S, printed_summary
from tests.harness.s3_server import Refusal, S3Server
from tests.harness.train_workers import RANK_0_PID, train_workers
from training.metrics.report import parse_step_line

pytestmark = pytest.mark.slow

BUCKET = "runs"
STORAGE = f"s3://{BUCKET}/runs"
STEPS, CHECKPOINT_EVERY, KILL_AFTER = 16, 5, 8


@pytest.fixture
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


def command(run_name: str, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "training", "--local",
        "--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
        "--storage-path", STORAGE, "--run-name", run_name, *flags,
    ]  # fmt: skip


def run(s3: S3Server, run_name: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(run_name, *flags),
        cwd=REPO_ROOT,
        env={**os.environ, **s3.env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def shard_bytes(s3: S3Server, checkpoint: str) -> dict[str, int]:
    """The size of each shard object of a checkpoint (`bucket/prefix`), as S3 lists it."""
    bucket, prefix = checkpoint.split("/", 1)
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/__")["Contents"]
    return {item["Key"].rsplit("/", 1)[1]: item["Size"] for item in listed}


def test_a_killed_worker_resumes_from_s3_reading_each_ranks_shards(s3):
    lines: list[str] = []
    killed, restart_at = None, None
    process = subprocess.Popen(
        command("killed", "--keep-checkpoints", "10"),  # the one resumed from stays to be measured
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **s3.env, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            step = parse_step_line(line)
            if killed is None and step is not None and step["step"] == KILL_AFTER:
                prefix = RANK_0_PID.search(line)
                assert prefix is not None, line
                killed = next(pid for pid in train_workers(process.pid) if pid != int(prefix.group(1)))
                os.kill(killed, signal.SIGKILL)
                restart_at = len(s3.requests)
        _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert killed is not None and restart_at is not None
    assert process.returncode == 0, stderr[-4000:]
    summary = printed_summary("".join(lines))
    [attempt] = summary["attempts"]
    resumed = attempt["resumed_from_step"]
    assert resumed == summary["start_step"] == CHECKPOINT_EVERY  # steps lost: at most one interval
    assert attempt["lost_steps"] <= CHECKPOINT_EVERY + 1
    assert summary["steps"] == STEPS and summary["run_dir"] == f"{STORAGE}/killed"

    # The checkpoints are objects under the run's prefix, every rank's shards and the metadata.
    checkpoint = f"{BUCKET}/runs/killed/checkpoint_{resumed:06d}"
    written = {r.key.rsplit("/", 1)[1] for r in s3.requests if r.method == "PUT" and checkpoint in r.key}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "train_state.json"} <= written
    # The restart read the shards by byte range in a few requests, and less than the checkpoint
    # downloaded to every worker (2 x its shards). At this model's size the gaps between the items a
    # rank needs of the other rank's file are under the merge gap, so it reads most of that file too
    # (tests/training/components/test_storage.py has the cluster's layout).
    reads = [r for r in s3.requests[restart_at:] if r.method == "GET" and f"{checkpoint}/__" in r.key]
    assert reads and all(r.ranged and r.status == 206 for r in reads)
    read_bytes = sum(r.range_bytes or 0 for r in reads)
    sizes = shard_bytes(s3, checkpoint)
    print(f"measured: the restart read {read_bytes} bytes of shards {sizes} in {len(reads)} ranged GETs")
    assert len(reads) <= 2 * len(sizes) and read_bytes < 2 * sum(sizes.values())


def test_a_checkpoint_whose_shard_upload_is_refused_is_never_registered(s3):
    """Rank 1's shard of step 10 never arrives: the commit drops it in one line and the run trains
    on. With every checkpoint after it refused too, the run ends; the next run of the name resumes
    from step 5, the newest whole checkpoint, never from step 10."""
    s3.refusals.append(Refusal("PUT", r"/checkpoint_0000(1[0-9])/__1_0\.distcp$"))
    first = run(s3, "refused", "--max-failures", "0")
    assert "checkpoint of step 10 not committed, its write is not whole (rank 1: " in first.stdout
    assert first.returncode != 0 or "checkpoint of step 16" not in first.stdout
    s3.refusals.clear()
    second = run(s3, "refused")
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from step 5 " in second.stdout
    assert printed_summary(second.stdout)["start_step"] == CHECKPOINT_EVERY


def test_a_sigterm_with_storage_slower_than_the_grace_exits_in_time_and_the_rerun_resumes_where_it_says(s3):
    """Uploads at 700 kB/s, shared by both ranks: a checkpoint of the tiny model (about 5.3 MB) takes
    some 8 s, about 11 steps, and the drain's grace is 5 s. (Slower, each rank's single 2.6 MB part would outlast the
    AWS SDK's request timeout, about 10 s here, and be retried without end, as on a real link.) The
    SIGTERM comes with a write in flight that cannot commit in time: the notice's line says so and
    names the step a restart goes back to, the driver exits within the grace plus 10 s saying nothing
    was committed, and the rerun resumes from exactly the step it names."""
    s3.rate_bytes_per_s = 700e3
    grace_s = 5
    # Step 10's write is committed at step 20 (the next one due waits for it), step 20's then starts:
    # the SIGTERM comes at step 21, and the notice is acted on within 3 s, before step 30's is due.
    flags = ("--steps", "40", "--checkpoint-every", "10")
    process = subprocess.Popen(
        [*command("slow"), *flags],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            **s3.env,
            "OMP_NUM_THREADS": "1",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(grace_s),
        },
    )
    lines: list[str] = []
    signalled = None
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            step = parse_step_line(line)
            committed = any("checkpoint of step 10 committed" in seen for seen in lines)
            if signalled is None and committed and step is not None and step["step"] >= 21:
                process.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
        process.wait(timeout=RUN_TIMEOUT_S)
        exited_s = time.monotonic() - (signalled or 0.0)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(lines)
    assert signalled is not None, output[-3000:]
    notice = next(line for line in lines if "drain notice (Ray Train preemption of node" in line)
    assert "no checkpoint can commit before" in notice, notice
    assert "a restart resumes from step 10, the latest committed" in notice
    last = lines[-1]
    assert last.startswith("SIGTERM: no checkpoint committed within ") and "the latest is step 10" in last, (
        last
    )
    assert exited_s <= grace_s + 10, exited_s
    print(f"measured: exit {exited_s:.1f} s after the SIGTERM, grace {grace_s} s; {notice.strip()}")

    s3.rate_bytes_per_s = None
    rerun = run(s3, "slow", *flags)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert "resumed from step 10 " in rerun.stdout
