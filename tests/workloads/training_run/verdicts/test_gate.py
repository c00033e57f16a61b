"""The gate's judgement, a pure function of the probe run's facts: which check fails first, in one line."""

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
MOVED = EfaTraffic(
    {"pod-a": 1, "pod-b": 1}, {"pod-a": {"tx_bytes": 9, "rx_bytes": 9}, "pod-b": {"tx_bytes": 9}}
)
FAST = {"all_reduce": 38.0, "all_gather": 39.0, "reduce_scatter": 38.5}


def gate(verdict: Verdict = EFA, efa: EfaTraffic | None = MOVED, busbw=FAST, rejudged=None) -> GateResult:
    run = JobResult("eks-ray-train-gate-main-0", "SUCCEEDED", {}, verdict, {"pod-a": 4}, rejudged, efa)
    return GateResult(run, ProbeResult(run.submission_id, dict(busbw), 1 << 30), 12.3)


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
    stuck = EfaTraffic({"pod-a": 1, "pod-b": 1}, {"pod-a": {"tx_bytes": 9}, "pod-b": {"tx_bytes": 0}})
    problem, fix = gate_problem(gate(efa=stuck), "efa", 40.0, 0.9) or ("", "")
    assert "pod-b: 0 bytes sent or received through its 1 EFA port(s)" in problem and "pod-a:" not in problem
    assert "{'pod-a': 9, 'pod-b': 0}" in problem and "fi_info -p efa" in fix


def test_busbw_under_the_floor_names_the_numbers_and_the_key():
    busbw = {"all_reduce": 41.0, "all_gather": 35.2, "reduce_scatter": 38.0}
    problem, fix = gate_problem(gate(busbw=busbw), "efa", 40.0, 0.9) or ("", "")
    assert (
        "all_gather: busbw 35.2 Gbit/s = 0.88 of the 40 Gbit/s line rate, under minBusbwFraction 0.9"
        in problem
    )
    assert "1073741824 byte messages" in problem and "training.minBusbwFraction" in fix


def test_counters_and_the_floor_are_efas_and_unreadable_counters_are_not_judged():
    socket = Verdict("socket", "a channel via NET/Socket", "high")
    assert gate_problem(gate(socket, efa=None, busbw={"all_reduce": 1.0}), "socket", 40.0, 0.9) is None
    unread = EfaTraffic({}, {}, {"pod-a": "no Ready efa-counters pod on node node-a"})
    assert gate_problem(gate(efa=unread), "efa", 40.0, 0.9) is None  # unavailable, not unmoved


def test_a_rejudged_gate_says_so():
    with pytest.raises(errors.TrainingRunError, match=r"\(note: SUCCEEDED earlier on these very pods\)$"):
        check_gate(
            gate(busbw={"all_reduce": 1.0}, rejudged="SUCCEEDED earlier on these very pods"), "efa", 40.0, 0.9
        )
