"""Evidence: the driver log, the NCCL lines of this job only (NCCL log files, else Ray worker logs), coverage, the transport check."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.harness.training_run_fakes import (
    EFA_JOB,
    FALLBACK_JOB,
    OOM_JOB,
    POD_LOGS,
    PROBE_JOB,
    SMOKE_ARGS,
    WORKER_NODES,
    WORKER_PODS,
    FakeCluster,
    FakeRayHead,
    FixturePod,
    driver_log,
    driver_log_with,
    failure_of,
    main_and_tcp_head,
    probe_job,
    props,
    rank0_line,
    run_inputs,
    scripted,
)
from training.metrics.report import format_node_leaving_line
from workloads.efa_counter_reader import counters_command
from workloads.training_run.access import jobs
from workloads.training_run.readiness import host_limits_command
from workloads.training_run.verdicts import evidence


def test_job_log_parses_steps_across_chunks_and_finds_the_summary():
    text = driver_log("driver_main.log")
    log = evidence.JobLog()
    steps = []
    for start in range(0, len(text), 97):  # chunks split lines anywhere
        steps += log.feed(text[start : start + 97])
    steps += log.close()
    assert [step["step"] for step in steps] == [1, 2, 3, 4, 5]
    assert log.summary()["tokens_per_s"] == 530.6 and log.summary()["world_size"] == 8
    assert len(log.nccl_lines) == 3


def test_job_log_collects_the_nodes_the_job_asks_to_leave_it_behind_rays_worker_tag():
    """Rank 0's NODE_LEAVING line, relayed by Ray with its worker tag in front, split across chunks;
    each ask is kept, in order (the follower acts once per node)."""
    asks = [
        rank0_line(format_node_leaving_line("ip-10-0-3-58.ec2.internal", "two faults in a row", 1800)),
        rank0_line(format_node_leaving_line("ip-10-0-3-58.ec2.internal", "two faults in a row", 1200)),
    ]
    text = driver_log_with(driver_log("driver_main.log"), "step 2/5", asks)
    log = evidence.JobLog()
    for start in range(0, len(text), 61):
        log.feed(text[start : start + 61])
    log.close()
    assert log.leaving_nodes == ["ip-10-0-3-58.ec2.internal"] * 2
    assert [step["step"] for step in log.steps] == [1, 2, 3, 4, 5]  # the steps read as before


def test_worker_logs_of_other_jobs_never_reach_the_verdict():
    """The pods also hold job 01000000, which fell back to sockets: only the run's own files count."""
    fake = FakeCluster(main_and_tcp_head())
    assert fake.provider().create(props(run_inputs())).outs["transport"] == "efa"
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    gate = jobs.submission_id_base(run_inputs().job_identity(), "gate-main", {})
    for pod in fake.workers.values():
        assert pod.commands == [
            host_limits_command(),  # readiness: the node's driver and memlock limit
            evidence.nccl_lines_command(jobs.NCCL_LOG_DIR, gate, evidence.RAY_LOG_DIR, PROBE_JOB),
            evidence.nccl_lines_command(jobs.NCCL_LOG_DIR, base, evidence.RAY_LOG_DIR, EFA_JOB),
        ]
    # The EFA counters are read in each node's reader pod, before and after the probe and the job.
    for reader in fake.readers.values():
        assert reader.commands == [counters_command()] * 4


def nccl_log_files(tmp_path: Path, submission_id: str, fake: FakeCluster) -> dict[str, FixturePod]:
    """The worker pods as a job with NCCL log files leaves them: NCCL wrote to its own file per
    process (`NCCL_DEBUG_FILE` expanded as NCCL does: `nccl-<id>.<host>.<pid>.log`), so the Ray
    worker logs hold no NCCL lines. Each pod also keeps a socket run's file of another submission."""
    pods = {}
    for name in WORKER_PODS:
        logs = shutil.copytree(POD_LOGS / name / "logs", tmp_path / name / "logs")
        nccl = tmp_path / name / "tmp-ray"
        nccl.mkdir()
        for out in logs.glob(f"worker-*-{EFA_JOB}-*.out"):
            lines = out.read_text().splitlines(keepends=True)
            pid = out.name.rsplit("-", 1)[1].split(".")[0]
            (nccl / f"nccl-{submission_id}.{name}.{pid}.log").write_text(
                "".join(line for line in lines if "NCCL" in line)
            )
            out.write_text("".join(line for line in lines if "NCCL" not in line))
        socket_run = next(logs.glob(f"worker-*-{FALLBACK_JOB}-*.out")).read_text()
        (nccl / f"nccl-{submission_id}-2.{name}.1.log").write_text(socket_run)
        pods[name] = FixturePod(name, logs, nccl, fake.head.efa[WORKER_NODES[name]])
    return pods


def test_the_jobs_nccl_log_files_are_read_one_per_rank(tmp_path):
    """NCCL's own line-buffered files of this submission decide; Ray's worker logs and the driver's
    relayed copy hold no NCCL line, and another submission's files (a socket run) never count."""
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    quiet = "".join(
        line for line in driver_log("driver_main.log").splitlines(keepends=True) if "NCCL" not in line
    )
    fake = FakeCluster(main_and_tcp_head(driver_log=quiet))
    fake.workers = nccl_log_files(tmp_path, base, fake)
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["transport"] == "efa" and outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 4)
    assert any("via NET/Libfabric/0" in line for line in outs["evidence"])
    assert any(f"NCCL log files read: {dict.fromkeys(WORKER_PODS, 4)}" in line for line in fake.logged)


def test_a_rank_without_its_nccl_log_file_leaves_the_verdict_unknown(tmp_path):
    """The coverage floor holds over the NCCL log files: one judged process per rank."""
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    quiet = "".join(
        line for line in driver_log("driver_main.log").splitlines(keepends=True) if "NCCL" not in line
    )
    fake = FakeCluster(main_and_tcp_head(driver_log=quiet))
    fake.workers = nccl_log_files(tmp_path, base, fake)
    next(fake.workers[WORKER_PODS[1]].nccl_logs.glob(f"nccl-{base}.*.log")).unlink()
    message = failure_of(fake)
    assert message.startswith("NCCL used 'unknown' between the nodes, not 'efa'")
    assert "the lines of only 7 NCCL processes on 2 hosts tell their transport" in message
    assert "nothing tells it for 1 of 8 ranks" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 4, '{WORKER_PODS[1]}': 3}}" in message
    assert f"/tmp/ray/nccl-{base}.*.log" in message


def test_an_efa_verdict_missing_a_worker_pod_is_unknown_and_names_what_is_missing(tmp_path):
    """A worker pod restarted since the job ran has lost its logs: the driver relays the lines of
    one of its four ranks, and four EFA ranks on one pod prove nothing about the other pod."""
    fake = FakeCluster(main_and_tcp_head())
    (tmp_path / "restarted").mkdir()
    fake.workers[WORKER_PODS[1]] = FixturePod(
        WORKER_PODS[1], tmp_path / "restarted", efa=fake.head.efa[WORKER_NODES[WORKER_PODS[1]]]
    )
    message = failure_of(fake)
    assert message.startswith("NCCL used 'unknown' between the nodes, not 'efa' (job eks-ray-train-main-")
    assert "the lines of only 5 NCCL processes on 2 hosts tell their transport (efa: " in message
    assert "nothing tells it for 3 of 8 ranks" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 8, '{WORKER_PODS[1]}': 0}}" in message


def test_a_verdict_must_cover_the_ranks_of_the_job_args():
    """`--workers` is the world size; without it the job runs one rank per GPU of the worker pods."""
    assert evidence.expected_coverage(SMOKE_ARGS, gpus_per_node=4, worker_pods=2) == (8, 2)
    assert evidence.expected_coverage(["--workers", "4"], gpus_per_node=4, worker_pods=2) == (4, 1)
    assert evidence.expected_coverage(["--workers=6"], gpus_per_node=4, worker_pods=2) == (6, 2)
    assert evidence.expected_coverage(["--preset", "smoke"], gpus_per_node=8, worker_pods=3) == (24, 3)


def test_rotated_worker_logs_are_read(tmp_path):
    """Ray rotates a worker's log by size: the oldest lines, NCCL's init and channel lines among
    them, move to `worker-...-<pid>.out.1` (Ray 2.58 with `RAY_ROTATION_MAX_BYTES`)."""
    fake = FakeCluster(main_and_tcp_head())
    for name in WORKER_PODS:
        logs = shutil.copytree(POD_LOGS / name / "logs", tmp_path / name)
        for out in logs.glob(f"worker-*-{EFA_JOB}-*.out"):
            out.rename(out.with_name(out.name + ".1"))
            out.write_text("TRAIN_STEP lines go on in the newer part\n")
        fake.workers[name] = FixturePod(name, logs, efa=fake.head.efa[WORKER_NODES[name]])
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["transport"] == "efa"
    assert outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 12)  # 4 workers x .out.1/.out/.err


def test_a_tcp_fallback_fails_the_update_with_the_evidence():
    head = FakeRayHead({"main": scripted(FALLBACK_JOB, "driver_tcp.log")})
    message = failure_of(FakeCluster(head))
    assert message.startswith("NCCL used 'socket' between the nodes, not 'efa' (job eks-ray-train-main-")
    assert "NCCL processes used TCP sockets between nodes (channels via NET/Socket)" in message
    assert "via NET/Socket/0" in message and "NET/OFI aws-ofi-nccl initialization failed" in message
    assert f"worker log files read: {{'{WORKER_PODS[0]}': 8, '{WORKER_PODS[1]}': 8}}" in message


def test_expecting_another_transport_passes_when_it_is_found():
    head = FakeRayHead(
        {"main": scripted(FALLBACK_JOB, "driver_tcp.log")},
        probes_by_variant={"main": probe_job(FALLBACK_JOB, efa_traffic={})},
    )
    outs = FakeCluster(head).provider().create(props(run_inputs(expect_transport="socket"))).outs
    assert outs["transport"] == "socket" and outs["gate_transport"] == "socket"


def test_a_failed_job_shows_the_driver_and_worker_log_tails():
    head = FakeRayHead(
        {
            "main": scripted(
                OOM_JOB,
                "driver_failed.log",
                final="FAILED",
                message="Job entrypoint command failed with exit code 1, last available logs:\n...",
            )
        }
    )
    message = failure_of(FakeCluster(head))
    assert message.startswith("job eks-ray-train-main-")
    assert "FAILED: Job entrypoint command failed with exit code 1, last available logs:\n" in message
    assert "training failed: Training worker group failed after 0 retries" in message  # driver tail
    assert f"last lines of the job's 8 worker log files on {WORKER_PODS[0]}:" in message
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 3" in message
