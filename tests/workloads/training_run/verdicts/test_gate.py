"""The gate's judgement, a pure function of the probe run's evidence: which check fails first, in one line."""

from __future__ import annotations

import pytest

from workloads.nccl_transport import Verdict
from workloads.training_run import errors
from workloads.training_run.verdicts.efa_counters import EfaTraffic
from workloads.training_run.verdicts.evidence import JobResult
from workloads.training_run.verdicts.fabric import ProbeResult
from workloads.training_run.verdicts.gate import GateResult, check_gate, gate_problem

EFA = Verdict(
    "efa", "channels via NET/Libfabric on 8 ranks", "high", ["a:1 [0] NCCL INFO ... via NET/Libfabric/0"]
)
GIB = 1 << 30
PROBE_LEAST = 48 * GIB  # the bytes the probe's collectives must bring into each node
MOVED = EfaTraffic(
    {"pod-a": 1, "pod-b": 1},
    {"pod-a": {"tx_bytes": 60 * GIB, "rx_bytes": 60 * GIB}, "pod-b": {"tx_bytes": 30 * GIB}},
)
FAST = {"all_reduce": 38.0, "all_gather": 39.0, "reduce_scatter": 38.5}


def gate(
    verdict: Verdict = EFA,
    efa: EfaTraffic | None = MOVED,
    busbw=FAST,
    rejudged=None,
    least: int | None = PROBE_LEAST,
) -> GateResult:
    run = JobResult("eks-ray-train-gate-main-0", "SUCCEEDED", {}, verdict, {"pod-a": 4}, rejudged, efa)
    return GateResult(run, ProbeResult(run.submission_id, dict(busbw), GIB, least), 12.3)


def test_a_healthy_fabric_passes():
    assert gate_problem(gate(), "efa", 40.0, 0.9) is None
    check_gate(gate(), "efa", 40.0, 0.9)


def test_the_transport_is_judged_first_and_its_fix_names_the_probes_nccl_files():
    socket = Verdict("socket", "a channel via NET/Socket", "high", ["b:7 [3] NCCL INFO ... via NET/Socket/0"])
    with pytest.raises(errors.TrainingRunError) as caught:
        check_gate(gate(socket, efa=EfaTraffic({"pod-a": 1}, {"pod-a": {}})), "efa", 40.0, 0.9)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "the fabric gate (probe job eks-ray-train-gate-main-0, 12.3 s after the pods were ready) failed, "
        "so the training job was not submitted: NCCL used 'socket' between the nodes, not 'efa'"
    )
    assert "first evidence: b:7 [3] NCCL INFO ... via NET/Socket/0" in message
    assert "/tmp/ray/nccl-eks-ray-train-gate-main-0.*.log" in message and "FI_PROVIDER=efa" in message


def test_counters_that_did_not_move_on_one_node_fail_naming_it_and_the_bytes():
    stuck = EfaTraffic({"pod-a": 1, "pod-b": 1}, {"pod-a": {"tx_bytes": 30 * GIB}, "pod-b": {"tx_bytes": 0}})
    problem, fix = gate_problem(gate(efa=stuck), "efa", 40.0, 0.9) or ("", "")
    assert f"pod-b: 0 bytes moved through its 1 EFA port(s), under {24 * GIB}" in problem
    assert "pod-a:" not in problem.split("(EFA bytes")[0]
    assert f"{{'pod-a': {30 * GIB}, 'pod-b': 0}}" in problem and "fi_info -p efa" in fix


def test_counters_that_moved_only_by_handshakes_fail_against_what_the_probe_sent():
    """The probe brought at least 48 GiB into each node; tens of KiB on a node are connection set-up."""
    handshakes = EfaTraffic(
        {"pod-a": 1, "pod-b": 1},
        {"pod-a": {"tx_bytes": 60 * GIB}, "pod-b": {"tx_bytes": 32_768, "rx_bytes": 32_768}},
    )
    problem, _ = gate_problem(gate(efa=handshakes), "efa", 40.0, 0.9) or ("", "")
    assert problem.startswith("NCCL's log says EFA, but the EFA counters of the worker nodes did not move")
    assert (
        f"pod-b: 65536 bytes moved through its 1 EFA port(s), under {24 * GIB} "
        f"(0.5 of the {48 * GIB} bytes the probe's collectives must bring into each node)"
    ) in problem


def test_unreadable_counters_fail_the_gate_naming_the_node_the_reason_and_the_fix():
    """A check that cannot measure must not pass: every node unread, or one, is a failure."""
    why = "no running efa-counters pod on node node-b (`kubectl -n efa-counters get pods -o wide`)"
    for unread in (
        EfaTraffic({}, {}, {"pod-a": why, "pod-b": why}),
        EfaTraffic({"pod-a": 1}, {"pod-a": {"tx_bytes": 60 * GIB}}, {"pod-b": why}),
    ):
        problem, fix = gate_problem(gate(efa=unread), "efa", 40.0, 0.9) or ("", "")
        assert problem.startswith("the EFA counters of the worker nodes could not be read")
        assert f"pod-b: its node's EFA counters could not be read: {why}" in problem
        assert "kubectl -n efa-counters get pods -o wide" in fix and "training.checkEfaCounters" in fix
    problem, fix = gate_problem(gate(efa=None), "efa", 40.0, 0.9) or ("", "")
    assert problem == "the EFA counters around the probe were not read" and "kubectl" in fix


def test_the_counter_check_turned_off_judges_transport_and_busbw_alone():
    unread = EfaTraffic({}, {}, {"pod-a": "no running efa-counters pod on node node-a"})
    assert gate_problem(gate(efa=unread), "efa", 40.0, 0.9, check_counters=False) is None
    slow = {"all_reduce": 1.0, "all_gather": 1.0, "reduce_scatter": 1.0}
    assert gate_problem(gate(efa=unread, busbw=slow), "efa", 40.0, 0.9, check_counters=False) is not None


def test_a_probe_report_without_its_calls_cannot_be_judged():
    problem, fix = gate_problem(gate(least=None), "efa", 40.0, 0.9) or ("", "")
    assert "does not say how many calls it made" in problem and "iters" in fix


def test_a_tcp_baseline_probe_whose_efa_counters_moved_like_the_probe_is_refused():
    socket = Verdict("socket", "a channel via NET/Socket", "high")
    quiet = EfaTraffic({"pod-a": 1, "pod-b": 1}, {"pod-a": {"tx_bytes": 65_536}, "pod-b": {}})
    assert gate_problem(gate(socket, efa=quiet, busbw={"all_reduce": 1.0}), "socket", 40.0, 0.9) is None
    problem, fix = gate_problem(gate(socket, efa=MOVED), "socket", 40.0, 0.9) or ("", "")
    assert problem.startswith("the TCP baseline's probe cannot be shown to have run on TCP alone")
    assert f"pod-a: {120 * GIB} bytes moved through its EFA port(s), at least {24 * GIB}" in problem
    assert "NCCL_NET=Socket" in fix


def test_busbw_under_the_floor_names_the_numbers_and_the_key():
    busbw = {"all_reduce": 41.0, "all_gather": 35.2, "reduce_scatter": 38.0}
    problem, fix = gate_problem(gate(busbw=busbw), "efa", 40.0, 0.9) or ("", "")
    assert (
        "all_gather: busbw 35.2 Gbit/s = 0.88 of the 40 Gbit/s line rate, under minBusbwFraction 0.9"
        in problem
    )
    assert "1073741824 byte messages" in problem and "training.minBusbwFraction" in fix


def test_the_busbw_floor_is_efas():
    socket = Verdict("socket", "a channel via NET/Socket", "high")
    quiet = EfaTraffic({"pod-a": 1}, {"pod-a": {}})
    assert gate_problem(gate(socket, efa=quiet, busbw={"all_reduce": 1.0}), "socket", 40.0, 0.9) is None


def test_a_rejudged_gate_says_so():
    with pytest.raises(errors.TrainingRunError, match=r"\(note: SUCCEEDED earlier on these very pods\)$"):
        check_gate(
            gate(busbw={"all_reduce": 1.0}, rejudged="SUCCEEDED earlier on these very pods"), "efa", 40.0, 0.9
        )
