"""One run end to end: the job flow against the fakes (adopt, retry, timeout, benchmark), and against a real local `ray start --head`."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from infra.planner.cost import CostBasis, list_price, measured_cost
from tests.harness.fake_efa_sysfs import HANDSHAKE_TRAFFIC
from tests.harness.fake_reader_node import FakeReaderNode
from tests.harness.paths import REPO_ROOT
from tests.harness.ray_head import RayHead, running_head, stop_process_tree, worker_node
from tests.harness.training_run_fakes import (
    EFA_JOB,
    EFA_JOB_TRAFFIC,
    FALLBACK_JOB,
    HEAD_POD,
    LOST_WORKER_ATTEMPT,
    OOM_JOB,
    PROBE_TRAFFIC,
    WORKER_NODES,
    WORKER_PODS,
    FakeCluster,
    FakeCoreApi,
    FakeCustomObjects,
    FakeRayHead,
    driver_log,
    failure_of,
    gpu_node,
    main_and_tcp_head,
    probe_job,
    props,
    ray_pod,
    run_inputs,
    scripted,
    with_restarts,
)
from training.components.attempts import ATTEMPTS_FILE
from training.config.run_config import TRAIN_STATE_FILE
from training.config.settings import NODE_NAME_ENV
from training.metrics.efa_sysfs import MOVED, SYSFS_ROOT
from workloads import manifests
from workloads.training_run import attempts, errors, provider, runner, schema
from workloads.training_run.access import jobs
from workloads.training_run.access.cluster_api import KubernetesCluster
from workloads.training_run.access.commands import LocalExecutor
from workloads.training_run.verdicts import evidence
from workloads.training_run.verdicts.efa_counters import ANY_TRAFFIC
from workloads.training_run.verdicts.evidence import JobResult


def test_a_run_over_efa_outputs_job_transport_evidence_and_throughput():
    fake = FakeCluster(main_and_tcp_head())
    result = fake.provider().create(props(run_inputs()))
    outs = result.outs
    assert outs["job_id"].startswith("eks-ray-train-main-") and outs["status"] == "SUCCEEDED"
    assert outs["transport"] == "efa"
    assert any("via NET/Libfabric/0" in line for line in outs["evidence"])
    assert any("Selected provider is efa" in line for line in outs["evidence"])
    assert (outs["tokens_per_s"], outs["mfu"], outs["mfu_done"], outs["step_time_s"], outs["duration_s"]) == (
        530.6,
        0.00109,
        0.00094,
        1.93,
        52.3,
    )
    assert outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 8)  # 4 workers x .out/.err of job 02000000
    assert outs["efa_speedup"] is None and outs["tcp_tokens_per_s"] is None
    assert {key: outs[key] for key in schema.INPUTS} == run_inputs().props()  # diff compares against these
    # Read from the fake sysfs, both times: bytes sent, received and read by RDMA.
    moved = sum(EFA_JOB_TRAFFIC.get(name, 0) for name in MOVED)
    assert (
        outs["efa_bytes"] == dict.fromkeys(WORKER_PODS, moved) == dict.fromkeys(WORKER_PODS, 38_654_709_760)
    )
    assert outs["efa_counters"][WORKER_PODS[0]]["retrans_pkts"] == 2
    assert outs["efa_counters"][WORKER_PODS[0]]["impaired_remote_conn_events"] == 0
    # The fabric gate ran before the job, on its worker group: its own NCCL verdict, the EFA bytes
    # its traffic moved on every node, busbw at 1 GiB against the 40 Gbit/s line.
    (probe,) = fake.head.probe_submissions
    assert probe[probe.index("--") :] == [
        "--",
        "python",
        "-m",
        "training.fabric_probe",
        "--workers",
        "8",
        "--use-gpu",
        "--gpus-per-worker",
        "1",
    ]
    assert outs["gate_job_id"].startswith("eks-ray-train-gate-main-") and outs["line_rate_gbps"] == 40.0
    assert (outs["gate_transport"], outs["transport"]) == ("efa", "efa")
    assert any("via NET/Libfabric/0" in line for line in outs["gate_evidence"])
    probed = PROBE_TRAFFIC["tx_bytes"] + PROBE_TRAFFIC["rx_bytes"]
    assert outs["gate_efa_bytes"] == dict.fromkeys(WORKER_PODS, probed)
    assert outs["gate_s"] == 30.0  # the fake clock: three polls of 10 s from the pods ready to the verdict
    gate_line = next(i for i, line in enumerate(fake.logged) if "training run: fabric gate" in line)
    submitted = next(i for i, line in enumerate(fake.logged) if "submitted job eks-ray-train-main-" in line)
    assert gate_line < submitted
    assert outs["busbw_gbps"] == {"all_reduce": 33.6, "all_gather": 35.2, "reduce_scatter": 34.9}
    assert outs["busbw_fraction"] == {"all_reduce": 0.84, "all_gather": 0.88, "reduce_scatter": 0.872}
    progress = [line for line in fake.logged if "step 5/5" in line]
    assert progress and "531 tok/s" in progress[0]


def test_a_job_that_restarted_outputs_its_attempts_and_logs_a_line_for_each():
    """The job's summary reports its restarts (`workloads.training_run.attempts`): the outputs carry
    them as reported, the stack output `training` shows them, and `pulumi up` logs one line per
    attempt naming its cause, node and lost steps."""
    second = {**LOST_WORKER_ATTEMPT, "attempt": 2, "node": None, "recovery_s": None, "cause": "NCCL error"}
    restarted = with_restarts(driver_log("driver_main.log"), [LOST_WORKER_ATTEMPT, second])
    fake = FakeCluster(main_and_tcp_head(driver_log=restarted))
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["status"] == "SUCCEEDED" and outs["restarts"] == 2
    assert outs["attempts"] == [LOST_WORKER_ATTEMPT, second]
    assert {"restarts", "attempts"} <= set(provider.training_output_keys()[provider.TOP].values())
    lines = [line for line in fake.logged if ": restart " in line]
    assert lines == [
        f"training run: job {outs['job_id']}: restart 1 on ray-train-gpu-workers-worker-b: worker on "
        "ray-train-gpu-workers-worker-b died: ActorDiedError (the pod was deleted); failed after step 3, "
        "resumed from step 2, 1 steps lost, recovered in 41.5 s",
        f"training run: job {outs['job_id']}: restart 2: NCCL error; failed after step 3, resumed from "
        "step 2, 1 steps lost, no step finished after it",
    ]


def test_a_summary_without_restarts_leaves_them_unknown_and_logs_none():
    """A job whose summary says nothing of restarts (a training package without them) is not read as
    one that never restarted: both outputs are null."""
    fake = FakeCluster(main_and_tcp_head())
    outs = fake.provider().create(props(run_inputs())).outs
    assert (outs["restarts"], outs["attempts"]) == (None, None)
    assert not [line for line in fake.logged if ": restart " in line]
    unrestarted = with_restarts(driver_log("driver_main.log"), [])
    outs = FakeCluster(main_and_tcp_head(driver_log=unrestarted)).provider().create(props(run_inputs())).outs
    assert (outs["restarts"], outs["attempts"]) == (0, [])


def test_benchmark_runs_efa_then_a_fair_tcp_baseline_and_outputs_the_ratio():
    fake = FakeCluster(main_and_tcp_head())
    outs = fake.provider().create(props(run_inputs(benchmark=True))).outs
    main_submit, tcp_submit = fake.head.submissions
    main_env = json.loads(main_submit[main_submit.index("--runtime-env-json") + 1])["env_vars"]
    # The main run keeps the pods' NCCL settings; beside its NCCL log file, only Ray Train's restart wait.
    assert sorted(main_env) == ["NCCL_DEBUG_FILE", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"]
    tcp_env = json.loads(tcp_submit[tcp_submit.index("--runtime-env-json") + 1])["env_vars"]
    assert (tcp_env["NCCL_NET"], tcp_env["NCCL_NET_PLUGIN"]) == ("Socket", "none")
    assert (
        int(tcp_env["NCCL_SOCKET_NTHREADS"]) * int(tcp_env["NCCL_NSOCKS_PERTHREAD"]) >= 8
    )  # not one lone socket
    assert outs["tcp_job_id"].startswith("eks-ray-train-tcp-") and outs["tcp_job_id"] != outs["job_id"]
    assert (outs["transport"], outs["tcp_transport"]) == ("efa", "socket")
    assert any("via NET/Socket/0" in line for line in outs["tcp_evidence"])
    assert (outs["tokens_per_s"], outs["tcp_tokens_per_s"]) == (530.6, 258.6)
    assert outs["efa_speedup"] == round(530.6 / 258.6, 3) == 2.052
    assert outs["tcp_efa_bytes"] == dict.fromkeys(WORKER_PODS, 0)  # the baseline left EFA alone
    _, tcp_probe = fake.head.probe_submissions  # both gates, each before its job
    assert "Socket" in tcp_probe[tcp_probe.index("--runtime-env-json") + 1]
    assert outs["tcp_gate_job_id"].startswith("eks-ray-train-gate-tcp-")
    assert outs["tcp_busbw_gbps"] == {"all_reduce": 14.2, "all_gather": 15.1, "reduce_scatter": 14.8}
    # The nodes' hours hold the baseline's run too: the per-token cost counts its tokens beside the job's.
    assert outs["tcp_summary"]["tokens_per_s"] == 258.6
    basis = CostBasis(list_price("g6.12xlarge", "us-east-2", None, "refused"), None, {})
    measured = measured_cost(
        basis.predicted_run,
        outs["gpu_nodes"],
        None,
        outs["finished_at"],
        outs["summary"],
        None,
        outs["tcp_summary"],
    )
    assert measured["tcpBaselineTokens"] == 5 * 1024 and measured["tokens"] == 5 * 1024
    job_alone = measured_cost(
        basis.predicted_run, outs["gpu_nodes"], None, outs["finished_at"], outs["summary"]
    )
    assert measured["usdPerMillionTokens"] == pytest.approx(job_alone["usdPerMillionTokens"] / 2, abs=0.01)


def test_jobs_whose_nccl_lines_reach_only_their_nccl_log_files_are_judged_on_those():
    """As a real job submitted with `NCCL_DEBUG_FILE` is (NCCL src/debug.cc: once the file opens, NCCL
    writes there and not to stdout, so Ray relays no NCCL line to the driver's log): the probe's and
    the job's files alone cover every rank on both pods."""

    def quiet(job, lines_of):
        driver_log = "".join(line for line in job.driver_log.splitlines(True) if "NCCL" not in line)
        return replace(job, driver_log=driver_log, nccl_lines_of=lines_of)

    head = main_and_tcp_head()
    head.jobs_by_variant["main"] = quiet(head.jobs_by_variant["main"], EFA_JOB)
    head.probes_by_variant["main"] = quiet(head.probes_by_variant["main"], EFA_JOB)
    outs = FakeCluster(head).provider().create(props(run_inputs())).outs
    assert (outs["gate_transport"], outs["transport"]) == ("efa", "efa")
    assert outs["transport_reason"].startswith("8 NCCL processes on 2 hosts")
    assert outs["worker_log_files"] == dict.fromkeys(WORKER_PODS, 4)


def test_a_busbw_under_the_floor_stops_before_the_job_with_the_numbers():
    fake = FakeCluster(main_and_tcp_head())
    message = failure_of(fake, run_inputs(min_busbw_fraction=0.875))
    assert fake.head.submissions == [] and len(fake.head.probe_submissions) == 1
    assert "\n" not in message
    assert message.startswith("the fabric gate (probe job eks-ray-train-gate-main-")
    assert "failed, so the training job was not submitted: the fabric is too slow for EFA" in message
    assert "1073741824 byte messages" in message
    assert (
        "reduce_scatter: busbw 34.9 Gbit/s = 0.872 of the 40 Gbit/s line rate, under minBusbwFraction 0.875"
        in message
    )
    # all_gather clears it (0.88); all_reduce (0.84) is reported, never judged: on two nodes NCCL's
    # tree all_reduce can go beyond the line rate.
    assert "all_gather: busbw" not in message and "all_reduce: busbw" not in message


def test_a_socket_fallback_in_the_gate_stops_before_the_job_and_again_with_a_fresh_probe():
    head = FakeRayHead(
        {"main": scripted(EFA_JOB, "driver_main.log")},
        probes_by_variant={"main": probe_job(FALLBACK_JOB, efa_traffic={})},
    )
    fake = FakeCluster(head)
    message = failure_of(fake)
    assert head.submissions == [] and len(head.probe_submissions) == 1
    assert "\n" not in message
    assert "not submitted: NCCL used 'socket' between the nodes, not 'efa' (high confidence)" in message
    assert "8 of 9 NCCL processes used TCP sockets between nodes" in message
    assert (
        "first evidence: ray-train-gpu-workers-worker-7xk2p:3100:3153 [0] NCCL INFO NET/OFI No eligible"
        in message
    )
    again = failure_of(fake)  # the next `pulumi up`, pods unchanged: a fresh probe, failed the same way
    assert head.submissions == [] and len(head.probe_submissions) == 2
    assert "not submitted: NCCL used 'socket' between the nodes" in again
    assert any("a probe is never judged again" in line for line in fake.logged)


def test_a_node_whose_counters_do_not_move_stops_the_gate_naming_it():
    fake = FakeCluster(main_and_tcp_head())
    fake.head.efa[WORKER_NODES[WORKER_PODS[1]]].stuck = True
    message = failure_of(fake)
    assert fake.head.submissions == []
    assert "\n" not in message and "the EFA counters of the worker nodes did not move" in message
    # The fixture's probe: 25 calls of 3 collectives at 1 MiB, 16 MiB, 256 MiB and 1 GiB on 2 nodes,
    # each of which must receive half of every message, 51000115200 bytes; the floor is half of that.
    assert (
        f"{WORKER_PODS[1]}: 0 bytes moved through its 1 EFA port(s), under 25500057600 (0.5 of the "
        "51000115200 bytes the probe's collectives must bring into each node)"
    ) in message
    assert f"{WORKER_PODS[0]}: 0 bytes" not in message
    probed = sum(PROBE_TRAFFIC.get(name, 0) for name in MOVED)
    assert f"{{'{WORKER_PODS[0]}': {probed}, '{WORKER_PODS[1]}': 0}}" in message


def test_a_node_that_moved_only_handshakes_while_the_probe_sent_gib_fails_the_gate():
    """NCCL's lines say EFA, and each node's counters moved, but by 64 KiB: connection set-up, not
    the tens of GiB the probe's collectives put through each node."""
    head = main_and_tcp_head()
    head.probes_by_variant["main"] = probe_job(efa_traffic=HANDSHAKE_TRAFFIC)
    message = failure_of(FakeCluster(head))
    assert head.submissions == [] and "did not move with the probe's traffic" in message
    assert f"{WORKER_PODS[0]}: 65536 bytes moved through its 1 EFA port(s), under 25500057600" in message


def test_counters_no_reader_can_read_fail_the_gate_and_no_job_runs():
    """Every reader pod's container has died (CrashLoopBackOff): the run waits for them as long as
    the readiness wait allows, then fails the gate naming each node's reason and the fix."""
    fake = FakeCluster(main_and_tcp_head())
    for reader in fake.reader_nodes.values():
        reader.stop()
    message = failure_of(fake)
    assert fake.head.submissions == [] and "\n" not in message
    assert "the EFA counters of the worker nodes could not be read" in message
    assert (
        f"{WORKER_PODS[1]}: its node's EFA counters could not be read: no running efa-counters pod" in message
    )
    assert "training.checkEfaCounters" in message


def test_a_reader_rolled_during_the_probe_is_waited_for_and_its_node_judged():
    """The reader DaemonSet rolls while the probe runs (a changed `efa_sysfs.py`): node-b's reader is
    down from the probe's submission until a minute later. The after-read waits for it, so node-b,
    whose counters did not move, fails the gate on its 0 bytes, not as a node that was never read."""
    fake = FakeCluster(main_and_tcp_head())
    node = WORKER_NODES[WORKER_PODS[1]]
    fake.head.efa[node].stuck = True
    rolled_at: list[float] = []

    def replaced() -> bool:
        if fake.head.probe_submissions and not rolled_at:
            rolled_at.append(fake.clock.now)
        return bool(rolled_at) and fake.clock.now < rolled_at[0] + 60

    fake.reader_nodes[node].replaced = replaced
    message = failure_of(fake)
    assert f"{WORKER_PODS[1]}: 0 bytes moved through its 1 EFA port(s)" in message
    assert "could not be read" not in message and fake.head.submissions == []
    assert fake.clock.now >= rolled_at[0] + 60


@pytest.mark.slow  # about 21 s: a full Create whose every reader answers no probe
def test_a_reader_that_is_running_but_not_ready_is_still_read_by_exec():
    """A wedged or starting server (NotReady) does not stop the exec'd `print`, which reads sysfs itself."""
    fake = FakeCluster(main_and_tcp_head())
    for reader in fake.reader_nodes.values():
        reader._answers = lambda: False  # type: ignore[method-assign]  # the server answers no probe
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["status"] == "SUCCEEDED" and outs["efa_unavailable"] is None


def test_the_counter_check_turned_off_passes_unreadable_counters_and_says_it_was_off():
    fake = FakeCluster(main_and_tcp_head())
    for reader in fake.reader_nodes.values():
        reader.stop()
    outs = fake.provider().create(props(run_inputs(check_efa_counters=False))).outs
    assert outs["status"] == "SUCCEEDED" and outs["check_efa_counters"] is False
    assert set(outs["efa_unavailable"]) == set(WORKER_PODS)
    assert any(
        "the EFA counter check is off (training.checkEfaCounters: false)" in line for line in fake.logged
    )


def test_efa_in_the_logs_but_counters_that_did_not_move_fail_with_the_numbers():
    fake = FakeCluster(main_and_tcp_head(efa_traffic={}))
    message = failure_of(fake)
    assert (
        "NCCL's log says it used 'efa'" in message
        and "counters of the worker nodes do not show it" in message
    )
    assert f"{WORKER_PODS[0]}: 0 bytes sent or received through its 1 EFA port(s)" in message
    assert f"EFA bytes per worker pod during the job: {dict.fromkeys(WORKER_PODS, 0)}" in message
    # The next `pulumi up` on the same pods: the gate passes on a fresh probe, the finished job is
    # judged again by the counters recorded when it ran, and fails again; it is not trained again.
    again = failure_of(fake)
    assert "do not show it" in again and "SUCCEEDED earlier on these very pods" in again
    assert len(fake.head.submissions) == 1 and len(fake.head.probe_submissions) == 2


def test_an_adopted_job_without_recorded_counters_is_unmeasured_and_fails():
    """A job this program did not submit with its counters recorded (none read before it): its
    counters are unknown, never judged as unmoved from reads that began after it did, and never a
    pass: with the counter check off it passes, its counters reported unavailable."""
    why = "the job was submitted without its counters recorded before it"
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})

    def running_unrecorded() -> FakeCluster:
        head = main_and_tcp_head(efa_traffic={})
        head.jobs[base] = replace(head.jobs_by_variant["main"], statuses=["RUNNING", "SUCCEEDED"])
        return FakeCluster(head)

    message = failure_of(running_unrecorded())
    assert f"{WORKER_PODS[0]}: its node's EFA counters could not be read: {why}" in message
    assert "0 bytes" not in message
    fake = running_unrecorded()
    outs = fake.provider().create(props(run_inputs(check_efa_counters=False))).outs
    assert outs["transport"] == "efa" and outs["efa_bytes"] == dict.fromkeys(WORKER_PODS)
    assert outs["efa_unavailable"] == dict.fromkeys(WORKER_PODS, why)


def test_a_job_that_ended_unwatched_is_measured_before_the_next_probe_moves_the_counters():
    """`pulumi up` stopped following the job (timeout); the job then ended having moved nothing over
    EFA. The next `pulumi up` reads the counters before its own probe, so the probe's traffic is not
    counted as the job's: the job is red."""
    head = main_and_tcp_head(efa_traffic={}, statuses=["RUNNING"] * 12 + ["SUCCEEDED"])
    fake = FakeCluster(head)
    with pytest.raises(errors.TrainingRunError, match="still RUNNING after timeout_minutes=1"):
        fake.provider().create(props(run_inputs(timeout_minutes=1)))
    (job,) = [job for sid, job in head.jobs.items() if sid.startswith("eks-ray-train-main-")]
    job.looks = 99  # it ended while no `pulumi up` watched
    message = failure_of(fake)
    assert f"{WORKER_PODS[0]}: 0 bytes sent or received through its 1 EFA port(s)" in message
    assert len(head.submissions) == 1 and len(head.probe_submissions) == 2


def test_a_job_an_interrupted_run_left_running_is_judged_on_the_counters_recorded_at_its_submission():
    """Ctrl-C while the job ran: the next `pulumi up` follows it to its end and judges the counters
    from before its submission (recorded beside it) to its end, the whole job's traffic."""
    head = main_and_tcp_head()
    # A job longer than the first run's wait: 1 minute of the fake clock is 6 polls.
    statuses = ["RUNNING"] * 12 + ["SUCCEEDED"]
    head.jobs_by_variant["main"] = replace(head.jobs_by_variant["main"], statuses=statuses)
    fake = FakeCluster(head)
    with pytest.raises(errors.TrainingRunError, match="still RUNNING after timeout_minutes=1"):
        fake.provider().create(props(run_inputs(timeout_minutes=1)))
    outs = fake.provider().create(props(run_inputs())).outs
    assert len(head.submissions) == 1 and outs["efa_unavailable"] is None
    moved = sum(EFA_JOB_TRAFFIC.get(name, 0) for name in MOVED)
    assert outs["efa_bytes"] == dict.fromkeys(WORKER_PODS, moved)
    # No probe ran beside the running job: the gate that passed before it stands, as recorded.
    probe = sum(PROBE_TRAFFIC.get(name, 0) for name in MOVED)
    assert len(head.probe_submissions) == 1
    assert outs["gate_efa_bytes"] == dict.fromkeys(WORKER_PODS, probe)


def test_a_benchmark_whose_baseline_did_not_use_sockets_fails():
    head = FakeRayHead(
        {
            "main": scripted(EFA_JOB, "driver_main.log", efa_traffic=EFA_JOB_TRAFFIC),
            "tcp": scripted(EFA_JOB, "driver_main.log"),
        }
    )
    message = failure_of(FakeCluster(head), run_inputs(benchmark=True))
    assert "NCCL used 'efa' between the nodes, not 'socket' (job eks-ray-train-tcp-" in message


def test_an_interrupted_update_finds_the_running_job_and_waits_for_it():
    head = main_and_tcp_head()
    fake = FakeCluster(head)
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    head.jobs[base] = replace(
        scripted(EFA_JOB, "driver_main.log"), statuses=["RUNNING", "RUNNING", "SUCCEEDED"]
    )
    fake.record_counters_before(base)  # as the run that submitted it did
    for sysfs in head.efa.values():
        sysfs.add(EFA_JOB_TRAFFIC)
    outs = fake.provider().create(props(run_inputs())).outs
    assert head.submissions == [] and outs["job_id"] == base and outs["transport"] == "efa"
    assert any(f"following job {base} (RUNNING)" in line for line in fake.logged)


def test_a_failed_earlier_attempt_is_retried_under_the_next_id():
    head = main_and_tcp_head()
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    head.jobs[base] = scripted(OOM_JOB, "driver_failed.log", final="FAILED")
    head.jobs[base].looks = 99
    outs = FakeCluster(head).provider().create(props(run_inputs())).outs
    assert outs["job_id"] == f"{base}-2" and len(head.submissions) == 1


def test_a_job_whose_runtime_environment_failed_reports_rays_reason_without_a_job_id():
    """Ray sets no job id when the job fails before its driver starts (PENDING to FAILED, e.g. its
    runtime environment): the failure says Ray's reason and the driver's tail, and reads no worker logs."""
    why = "runtime_env setup failed: Failed to set up runtime environment.\nTraceback: ..."
    head = main_and_tcp_head()
    head.jobs_by_variant["main"] = replace(
        head.jobs_by_variant["main"], statuses=["PENDING", "FAILED"], message=why
    )
    fake = FakeCluster(head)
    message = failure_of(fake)
    assert message.startswith("job eks-ray-train-main-") and "FAILED: runtime_env setup failed" in message
    assert "worker log files" not in message


def test_a_succeeded_job_that_failed_its_check_is_judged_again_only_while_its_pods_live():
    """The next `pulumi up` re-judges it on the same pods (saying so), and runs a new attempt once a
    worker pod was replaced (a node roll after a security-group fix): the new pods are what is proven."""
    head = FakeRayHead({"main": scripted(FALLBACK_JOB, "driver_tcp.log")})
    base = jobs.submission_id_base(run_inputs().job_identity(), "main", {})
    fake = FakeCluster(head)
    first = failure_of(fake)
    assert f"(job {base}," in first and len(head.submissions) == 1 and "note:" not in first

    again = failure_of(fake)
    assert len(head.submissions) == 1 and f"(job {base}," in again
    assert f"note: job {base} SUCCEEDED earlier on these very pods" in again
    assert "replace the worker pods" in again

    rolled = [
        ray_pod(HEAD_POD, "head", node="system-node"),
        ray_pod(WORKER_PODS[0], "worker", uid="a-new-pod-under-the-old-name"),
        ray_pod(WORKER_PODS[1], "worker"),
    ]
    fake.core.pod_snapshots = [rolled]
    fake.core.pod_calls = 0
    head.jobs_by_variant["main"] = scripted(EFA_JOB, "driver_main.log", efa_traffic=EFA_JOB_TRAFFIC)
    outs = fake.provider().create(props(run_inputs())).outs
    assert outs["job_id"] == f"{base}-2" and outs["transport"] == "efa" and len(head.submissions) == 2
    assert any(
        f"job {base} SUCCEEDED earlier on other pods" in line and f"submitting {base}-2" in line
        for line in fake.logged
    )


def test_a_capacity_block_not_begun_is_waited_for_before_the_nodes_with_a_line_each_poll():
    """The fake wall clock starts at 09:00:00Z; the block starts 25 s later: polls of 10, 10 and 5 s."""
    waited = FakeCluster(main_and_tcp_head())
    waited.provider().create(props(run_inputs(not_before="2026-12-05T09:00:25Z")))
    lines = [line for line in waited.logged if "waiting for the Capacity Block's start" in line]
    assert [line.split("(")[1].split(")")[0] for line in lines] == [
        "0.4 min left",
        "0.2 min left",
        "0.1 min left",
    ]
    assert lines[0] == (
        "training run: waiting for the Capacity Block's start at 2026-12-05T09:00:25Z (0.4 min left); "
        "its GPU nodes launch then"
    )
    ready = next(i for i, line in enumerate(waited.logged) if "GPU nodes ready" in line)
    assert waited.logged.index(lines[-1]) < ready
    at_once = FakeCluster(main_and_tcp_head())
    at_once.provider().create(props(run_inputs(not_before="2026-12-05T08:00:00Z")))  # begun an hour ago
    assert not [line for line in at_once.logged if "Capacity Block" in line]
    assert waited.clock.slept - at_once.clock.slept == 25.0


def shipped_code(root: Path) -> tuple[Path, str]:
    """The training code as the ConfigMap mount presents it: the package files and `.code-hash`."""
    files = manifests.collect_code(REPO_ROOT)
    folder = root / "code"
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    (folder / manifests.CODE_HASH_FILE).write_text(manifests.code_hash(files))
    return folder, manifests.code_hash(files)


def local_environment(ray: RayHead, code_dir: Path, logged: list[str]) -> runner.RunEnvironment:
    """The local head as the run sees a cluster: fake nodes and pods, every pod exec run here."""
    core = FakeCoreApi(
        [[gpu_node("local-node")]],
        [[ray_pod("local-head", "head"), ray_pod("local-worker", "worker")]],
        # The reader reads this machine's sysfs: no EFA here.
        readers=[("local-efa-counters", "node-a", FakeReaderNode(Path(SYSFS_ROOT)))],
    )
    local = LocalExecutor(env=ray.env)
    return runner.RunEnvironment(
        KubernetesCluster(core, FakeCustomObjects(worker_replicas=1)),
        executor_for=lambda pod: local,
        dashboard_address=ray.dashboard,
        code_dir=str(code_dir),
        ray_log_dir=str(ray.session_logs),
        nccl_log_dir=str(ray.root),
        log=logged.append,
        poll_interval_s=0.5,
    )


def local_provider(ray: RayHead, code_dir: Path, logged: list[str]) -> provider.TrainingRunProvider:
    """The provider, connected to the local head."""

    @contextlib.contextmanager
    def connect(inputs, aws, timings):
        yield local_environment(ray, code_dir, logged)

    return provider.TrainingRunProvider(connect=connect)


def local_job(ray: RayHead, inputs: schema.RunInputs, code_dir: Path, logged: list[str]) -> JobResult:
    """The training job alone on the local head, through the run's own commands (no gate first)."""
    run = runner.TrainingRunner(inputs, local_environment(ray, code_dir, logged))
    return run.run_job(run.wait_until_ready(), runner.MAIN_VARIANT, {})


def ray_jobs(ray: RayHead) -> list[dict]:
    """The jobs submitted to the head's job API. Drivers that joined the shared head on their own
    (other tests' runs, through RAY_ADDRESS) are listed too, without a submission id."""
    with urllib.request.urlopen(f"{ray.dashboard}/api/jobs/", timeout=10) as reply:
        return [job for job in json.load(reply) if job["submission_id"]]


@pytest.mark.slow
def test_ray_head_runs_the_tiny_job_reports_it_and_checks_the_transport(ray_head):
    code_dir, code_hash = shipped_code(ray_head.root)
    job_args = (
        "--preset",
        "tiny",
        "--data",
        "synthetic",
        "--steps",
        "3",
        "--workers",
        "2",
        "--no-use-gpu",
        "--checkpoint-every",
        "0",
        "--storage-path",
        str(ray_head.root / "runs"),
    )
    inputs = run_inputs(code_hash=code_hash, job_args=job_args, expect_transport="efa", timeout_minutes=3)
    logged: list[str] = []

    # gloo on CPU prints no NCCL line: the transport is unknown, which no expectation accepts, so the
    # gate's probe (real, on the local Ray) stops the run before the training job is submitted.
    for _ in range(2):  # the second run judges a fresh probe of its own: a probe is never judged again
        with pytest.raises(errors.TrainingRunError) as caught:
            local_provider(ray_head, code_dir, logged).create(props(inputs))
        message = str(caught.value)
        assert message.startswith("the fabric gate (probe job eks-ray-train-gate-main-")
        assert (
            "the training job was not submitted: NCCL used 'unknown' between the nodes, not 'efa'" in message
        )
        assert "no NCCL lines found" in message and "\n" not in message
    listed = ray_jobs(ray_head)
    gates = [job for job in listed if job["submission_id"].startswith("eks-ray-train-gate-main-")]
    assert [job["status"] for job in gates] == ["SUCCEEDED", "SUCCEEDED"]
    first, second = sorted(job["submission_id"] for job in gates)
    assert second == f"{first}-2"
    assert gates[0]["entrypoint"].endswith("python -m training.fabric_probe --workers 2 --no-use-gpu")
    assert not [job for job in listed if job["submission_id"].startswith("eks-ray-train-main-")]

    # The job itself, through the same commands, judged as the gate's probe was.
    job = local_job(ray_head, inputs, code_dir, logged)
    with pytest.raises(errors.TrainingRunError) as caught:
        evidence.check_transport(job, "efa", ANY_TRAFFIC)
    message = str(caught.value)
    assert "NCCL used 'unknown' between the nodes, not 'efa'" in message
    assert "no NCCL lines found" in message
    assert "worker log files read: {'local-worker': " in message  # ... though the job's worker logs were read
    assert "{'local-worker': 0}" not in message

    listed = [job for job in ray_jobs(ray_head) if job["submission_id"].startswith("eks-ray-train-main-")]
    assert [job["status"] for job in listed] == ["SUCCEEDED"]
    # Ray kept what the submission attached: the pods it ran on, and where NCCL logs
    assert listed[0]["metadata"][jobs.PODS_METADATA].startswith("local-head=")
    nccl_file = listed[0]["runtime_env"]["env_vars"]["NCCL_DEBUG_FILE"]
    assert nccl_file == f"{ray_head.root}/nccl-{listed[0]['submission_id']}.%h.%p.log"
    assert any("step 3/3" in line for line in logged)
    reported = [line for line in logged if f"job {listed[0]['submission_id']}: " in line]
    assert any("NCCL transport unknown" in line for line in reported)
    assert any(line.endswith("tokens/s") for line in reported)


@pytest.mark.slow
def test_ray_head_failed_job_fails_with_its_log(ray_head):
    code_dir, code_hash = shipped_code(ray_head.root)
    inputs = run_inputs(code_hash=code_hash, job_args=("--preset", "tiny", "--steps", "0"), timeout_minutes=1)
    with pytest.raises(errors.TrainingRunError) as caught:
        local_job(ray_head, inputs, code_dir, [])
    message = str(caught.value)
    assert " FAILED: Job entrypoint command failed with exit code 2" in message
    assert "argument --steps: must be >= 1, got 0" in message


# A worker pod deleted mid-job, on a real local Ray. A KubeRay worker pod is a Ray node (`ray start
# --address=<head> --block`), so the "pod" is a second raylet on this machine (`ray_head.worker_node`)
# holding every CPU the training workers ask for; the head holds none, as the RayCluster's head holds
# no GPU. The pod deleted with its node gone is its raylet's process tree killed; KubeRay's replacement
# is a fresh raylet. The job runs through the run's own commands (`local_job`: the gate's probe cannot
# pass on CPU, where gloo prints no NCCL line). The job's driver log reaches the run in batches, so
# the kill waits for the first checkpoint on disk; steps of about 0.2 to 0.7 s on this CPU leave the
# job most of its steps after it.
RESTART_STEPS, RESTART_CHECKPOINT_EVERY = 60, 5
RESTART_WORKER_CPUS = 3  # two CPU workers and one for Ray Data's tasks, as `--local` sizes its embedded Ray


class RestartingJob:
    """The restart tests' job (tiny, synthetic, two workers, a checkpoint every 5 steps) followed by
    the run's own commands on a thread, as the provider follows it, while the test plays KubeRay."""

    def __init__(self, head: RayHead, max_failures: int, extra: tuple[str, ...] = ()) -> None:
        self.head, self.runs = head, head.root / "runs"
        code_dir, code_hash = shipped_code(head.root)
        job_args = (
            "--preset", "tiny",
            "--data", "synthetic",
            "--steps", str(RESTART_STEPS),
            "--workers", "2",
            "--no-use-gpu",
            "--checkpoint-every", str(RESTART_CHECKPOINT_EVERY),
            "--max-failures", str(max_failures),
            "--storage-path", str(self.runs),
            *extra,
        )  # fmt: skip
        inputs = run_inputs(code_hash=code_hash, job_args=job_args, timeout_minutes=10)
        self.logged: list[str] = []
        self.result: list[JobResult | BaseException] = []

        def run() -> None:
            try:
                self.result.append(local_job(head, inputs, code_dir, self.logged))
            except BaseException as error:  # handed to the test's thread
                self.result.append(error)

        self.follower = threading.Thread(target=run, daemon=True)

    def wait_for(self, found: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 300
        while not found():
            assert self.follower.is_alive() and time.monotonic() < deadline, (self.logged[-5:], self.result)
            time.sleep(0.2)

    def checkpointed(self) -> bool:
        """A complete checkpoint in the run's storage (its train state is written last)."""
        return any(self.runs.rglob(f"checkpoint_*/{TRAIN_STATE_FILE}"))

    def recovered(self) -> bool:
        """The controller has recorded the last restart's recovery: the restart reported a step."""
        stored = list(self.runs.rglob(ATTEMPTS_FILE))
        return bool(stored) and json.loads(stored[0].read_text())[-1]["recovery_s"] is not None

    def outcome(self) -> JobResult | BaseException:
        self.follower.join(timeout=540)
        assert self.result, "the job did not end within 9 minutes of the last fault"
        (outcome,) = self.result
        return outcome


@pytest.mark.slow
def test_a_worker_pod_deleted_mid_job_ends_succeeded_after_one_restart_naming_it():
    with running_head(num_cpus=0) as head:
        job = RestartingJob(head, max_failures=2)
        with worker_node(head, RESTART_WORKER_CPUS) as pod:
            job.follower.start()
            job.wait_for(job.checkpointed)
            stop_process_tree(pod)  # the pod deleted, its node gone
        with worker_node(head, RESTART_WORKER_CPUS):  # KubeRay's replacement pod
            outcome = job.outcome()
        assert isinstance(outcome, JobResult), outcome
        assert outcome.status == "SUCCEEDED" and outcome.summary["steps"] == RESTART_STEPS
        found = attempts.restarts_of(outcome.summary)
        assert found.restarts == 1
        (attempt,) = found.attempts or []
        assert attempt["attempt"] == 1 and attempt["cause"] and "\n" not in attempt["cause"]
        # The controller counts a step once every worker's report of it is polled: it may trail the
        # killed worker's last step (training.components.attempts), never the checkpoint resumed from.
        assert attempt["resumed_from_step"] % RESTART_CHECKPOINT_EVERY == 0
        assert attempt["failed_after_step"] >= attempt["resumed_from_step"]
        assert 0 <= attempt["lost_steps"] <= 2 * RESTART_CHECKPOINT_EVERY
        assert [line for line in job.logged if ": restart 1" in line] == [
            attempts.attempt_line(outcome.submission_id, attempt)
        ]


@pytest.mark.slow
def test_a_second_fault_in_a_row_on_one_node_fails_the_job_in_one_line_naming_it():
    """Two worker pods of one worker each, on two nodes (the downward API gives each pod its node's
    name, workloads/manifests/raycluster.py). The pod on node A is lost, its replacement lands on
    node A too and is lost as well: the next restart refuses to train there and the job fails with
    one line that names the node and the cordon. (With one worker per pod no Ray Data task needs a
    CPU: the data is synthetic.)"""
    node_a, node_b = "ip-10-0-1-23.us-east-2.compute.internal", "ip-10-0-1-57.us-east-2.compute.internal"
    with running_head(num_cpus=0) as head:
        job = RestartingJob(head, max_failures=3)
        with worker_node(head, 1, {NODE_NAME_ENV: node_b}, ip="127.0.0.3"):
            with worker_node(head, 1, {NODE_NAME_ENV: node_a}, ip="127.0.0.2") as pod:
                job.follower.start()
                job.wait_for(job.checkpointed)
                stop_process_tree(pod)
            with worker_node(head, 1, {NODE_NAME_ENV: node_a}, ip="127.0.0.2") as pod:  # its replacement
                job.wait_for(job.recovered)
                stop_process_tree(pod)
            with worker_node(head, 1, {NODE_NAME_ENV: node_a}, ip="127.0.0.2"):
                failure = job.outcome()
        assert isinstance(failure, errors.TrainingRunError), (
            getattr(failure, "summary", {}).get("attempts"),
            job.logged[-8:],
        )
        refusals = [line for line in str(failure).splitlines() if "two faults in a row on node" in line]
        assert len(refusals) == 1, str(failure)[-4000:]
        assert f"two faults in a row on node {node_a} " in refusals[0]
        assert f"kubectl cordon {node_a}" in refusals[0]


@pytest.mark.slow
def test_with_leave_failing_node_a_repeated_fault_takes_the_node_out_and_the_run_ends_on_its_replacement():
    """The previous test's two faults on node A, with `--leave-failing-node` (what the TrainingRun
    passes under `gpuNodeAutoRepair`). The third attempt lands on A again: its rank 0 asks for A to
    leave the job (a NODE_LEAVING line, which the run's follower logs) and its ranks wait. The test
    plays the TrainingRun's delete of A's worker pod and A's kubelet: SIGTERM to the pod's `ray start`,
    which Ray turns into a drain (ray/_private/node.py, `_drain_node_before_shutdown`); Ray Train
    restarts the worker group, which trains to the end on B and on C, A's replacement."""
    node_a, node_b, node_c = (f"ip-10-0-1-{n}.us-east-2.compute.internal" for n in (23, 57, 91))
    drain = {manifests.DRAIN_TIMEOUT_ENV: "5"}
    with running_head(num_cpus=0) as head:
        job = RestartingJob(head, max_failures=3, extra=("--leave-failing-node",))
        with worker_node(head, 1, {NODE_NAME_ENV: node_b}, ip="127.0.0.3"):
            with worker_node(head, 1, {NODE_NAME_ENV: node_a}, ip="127.0.0.2") as pod:
                job.follower.start()
                job.wait_for(job.checkpointed)
                stop_process_tree(pod)
            with worker_node(head, 1, {NODE_NAME_ENV: node_a}, ip="127.0.0.2") as pod:
                job.wait_for(job.recovered)
                stop_process_tree(pod)
            with worker_node(head, 1, {NODE_NAME_ENV: node_a, **drain}, ip="127.0.0.2") as pod:
                job.wait_for(lambda: any(f"asks node {node_a} to leave it" in line for line in job.logged))
                pod.send_signal(signal.SIGTERM)  # the pod deleted with its grace: Ray drains the node
                pod.wait(timeout=120)
            with worker_node(head, 1, {NODE_NAME_ENV: node_c}, ip="127.0.0.4"):  # the repaired node
                outcome = job.outcome()
        assert isinstance(outcome, JobResult), (job.logged[-8:], outcome)
        assert outcome.status == "SUCCEEDED" and outcome.summary["steps"] == RESTART_STEPS
        found = attempts.restarts_of(outcome.summary)
        nodes = [attempt["node"] for attempt in found.attempts or []]
        assert nodes[:2] == [node_a, node_a] and len(nodes) == 3, found.attempts
        # The drain that took A out: named by its node, or a restart Ray made with no error heard.
        assert nodes[2] in (node_a, None) and found.attempts[2]["recovery_s"] is not None
