"""The attempts record: a fault's one-line cause and node, the steps it lost and the seconds it took,
and the restarts refused (a second fault on one node, the recovery budget spent). The controller's
callback writing it where the restarted rank 0 reads it is tests/training/launch/test_attempt_store.py's."""

from __future__ import annotations

import pytest

from tests.harness.ray_faults import DEATH, HOSTS, NODE_DIED, PROCESS_DIED, actor_death
from training.components.attempts import (
    ATTEMPT_KEYS,
    CAUSE_CHARS,
    DETECTED_AT,
    Restarts,
    WorkerError,
    awaits_node_deaths,
    dumps_record,
    failing_node,
    fault_cause,
    loads_record,
    record_fault,
    record_recovery,
    recovery_spent_s,
    restart_backoff_s,
    restart_refusal,
)
from training.config.presets import PRESETS
from training.config.run_config import parse_flags
from training.errors import RestartRefusedError
from training.launch.attempt_store import worker_error
from training.launch.ray_launcher import WORKER_GROUP_START_TIMEOUT_S, start_retries
from training.metrics.report import parse_node_leaving_line
from training.session import Notice


def fault(node: str | None, *, at: float, recovery_s: float | None = 10.0, record=()) -> list[dict]:
    record = record_fault(
        record, cause="c", node=node, failed_after_step=9, resumed_from_step=5, detected_at=at
    )
    return record if recovery_s is None else record_recovery(record, first_step=6, at=at + recovery_s)


def test_a_dead_worker_is_the_cause_before_the_collective_errors_it_left_on_the_others():
    errors = [
        WorkerError(0, died=False, kind="DistBackendError", message="Connection closed by peer\nmore"),
        WorkerError(1, died=True, kind="ActorDiedError", message=DEATH),
    ]
    cause, node = fault_cause(errors, HOSTS)
    assert node == "ray-worker-b"
    assert cause == (
        "rank 1 on ray-worker-b died (and 1 other rank): ActorDiedError: "
        "The actor is dead because its worker process has died."
    )


def test_a_raised_error_is_its_first_line_and_a_long_one_is_cut():
    hang = "step 12 hung: rank 1 never reached all_reduce #57\nstacks follow"
    cause, node = fault_cause([WorkerError(3, died=False, kind="HangError", message=hang)], {})
    assert (cause, node) == (
        "rank 3 raised: HangError: step 12 hung: rank 1 never reached all_reduce #57",
        None,
    )
    long, _ = fault_cause([WorkerError(0, died=False, kind="E", message="x" * 1000)], HOSTS)
    assert len(long) == CAUSE_CHARS and "\n" not in long and long.endswith("…")


def test_a_fault_records_its_steps_and_its_recovery_the_first_step_after_the_restart():
    record = record_fault(
        [], cause="c", node="n", failed_after_step=9, resumed_from_step=5, detected_at=100.0
    )
    assert record[0]["lost_steps"] == 4 and record[0]["recovery_s"] is None
    recovered = record_recovery(record, first_step=6, at=114.25)
    assert {key: recovered[0][key] for key in ATTEMPT_KEYS} == {
        "attempt": 1,
        "cause": "c",
        "node": "n",
        "failed_after_step": 9,
        "resumed_from_step": 5,
        "lost_steps": 4,
        "recovery_s": 14.25,
    }
    # A second report of the same attempt keeps its first one's recovery.
    assert record_recovery(recovered, first_step=7, at=200.0) == recovered
    second = record_fault(
        recovered, cause="d", node=None, failed_after_step=5, resumed_from_step=5, detected_at=300
    )
    assert second[1]["attempt"] == 2 and second[1]["lost_steps"] == 0


TWO_NODES = ["ip-10-0-1-7"] * 4 + ["ip-10-0-1-9"] * 4


def test_two_faults_in_a_row_on_one_node_refuse_naming_it_and_the_fix():
    record = fault("ip-10-0-1-7", at=100.0, record=fault("ip-10-0-1-7", at=0.0))
    line = restart_refusal(record, budget_s=1800, nodes=TWO_NODES, leave=False)
    assert line is not None and "\n" not in line
    assert "two faults in a row on node ip-10-0-1-7" in line and "kubectl cordon ip-10-0-1-7" in line
    # The run's only node (a laptop, --local) is never refused for it; other or unknown nodes are not;
    # nor a node this attempt does not run on (it was replaced).
    assert restart_refusal(record, budget_s=1800, nodes=["ip-10-0-1-7"] * 8, leave=False) is None
    replaced = ["ip-10-0-1-11"] * 4 + ["ip-10-0-1-9"] * 4
    assert restart_refusal(record, budget_s=1800, nodes=replaced, leave=False) is None
    for other in (
        fault("b", at=100.0, record=fault("a", at=0.0)),
        fault(None, at=100.0, record=fault(None, at=0.0)),
    ):
        assert restart_refusal(other, budget_s=1800, nodes=["a", "b"], leave=False) is None
    assert restart_refusal([], budget_s=1800, nodes=TWO_NODES, leave=False) is None


def test_a_drain_does_not_count_as_a_fault_of_its_node():
    """A repair's reboot keeps the node's name: its drain and a later fault there are not two faults."""
    drained = record_fault(
        [],
        cause="drained",
        node="ip-10-0-1-7",
        failed_after_step=9,
        resumed_from_step=5,
        detected_at=0.0,
        drained=True,
    )
    record = fault("ip-10-0-1-7", at=100.0, record=drained)
    assert failing_node(record, TWO_NODES) is None
    assert failing_node(fault("ip-10-0-1-7", at=200.0, record=record), TWO_NODES) == "ip-10-0-1-7"


def test_with_leave_failing_node_a_repeated_fault_waits_for_the_node_to_be_taken_out():
    """Under EKS auto repair the node leaves the job: rank 0 asks for it in one machine-readable line,
    every rank waits for the drain that takes it, and a node nobody takes out ends the run."""
    config = parse_flags(["--run-name", "r", "--leave-failing-node"])
    record = fault("ip-10-0-1-7", at=100.0, record=fault("ip-10-0-1-7", at=0.0))
    restarts = Restarts.begin(record, config, TWO_NODES)
    assert restarts.leaving == "ip-10-0-1-7" and restarts.wait_s == pytest.approx(1800 - 10.0)
    lines: list[str] = []
    now = [0.0]
    notices = iter([None, None, Notice("Ray Train preemption of node 5c2b7a0e, ranks 0, 1, 2, 3")])

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(
        RestartRefusedError, match=r"^node ip-10-0-1-7 was not taken out of the job within 1790 s"
    ):
        restarts.wait(lambda: next(notices, None), lines.append, sleep, lambda: now[0])
    assert parse_node_leaving_line(lines[0]) == "ip-10-0-1-7"
    assert "waiting up to 1790 s" in lines[0]
    assert lines[1] == "node ip-10-0-1-7 is draining: Ray Train restarts the worker group once it is gone"
    assert now[0] == pytest.approx(1790.0)  # Ray tears the group down long before this on a cluster


def test_restarts_after_faults_in_a_row_on_nodes_back_off_doubling():
    assert restart_backoff_s(fault("a", at=0.0)) == 0.0
    two = fault("b", at=10.0, record=fault("a", at=0.0))
    assert restart_backoff_s(two) == 30.0
    four = fault("b", at=30.0, record=fault("a", at=20.0, record=two))
    assert restart_backoff_s(four) == 120.0
    assert restart_backoff_s(fault("c", at=40.0, record=fault("d", at=35.0, record=four))) == 240.0
    assert restart_backoff_s(fault(None, at=40.0, record=four)) == 0.0
    config = parse_flags(["--run-name", "r"])
    restarts = Restarts.begin(two, config, ["a", "b"])
    lines: list[str] = []
    slept: list[float] = []
    restarts.wait(lambda: None, lines.append, slept.append, lambda: 0.0)
    assert slept == [30.0] and lines == ["restart waits 30 s: faults in a row named nodes (backoff)"]


def test_the_budget_counts_the_recoveries_before_the_latest_and_refuses_once_spent():
    # 1: recovered in 10 s; 2: failed again 50 s after its fault without a step; 3: starting now.
    record = fault("a", at=0.0)
    record = fault("b", at=500.0, recovery_s=None, record=record)
    record = fault("c", at=550.0, recovery_s=None, record=record)
    assert recovery_spent_s(record) == pytest.approx(60.0)
    assert restart_refusal(record, budget_s=61, nodes=TWO_NODES, leave=False) is None
    line = restart_refusal(record, budget_s=60, nodes=TWO_NODES, leave=False)
    assert line is not None and "2 restarts spent 60 s recovering, --recovery-budget-s 60" in line


def test_rank_0_prints_one_line_per_restart_and_the_summary_holds_the_contracts_keys():
    config = parse_flags(["--run-name", "r"])
    stored = record_fault(
        [], cause="rank 1 died", node="vm", failed_after_step=8, resumed_from_step=5, detected_at=100.0
    )
    lines: list[str] = []
    restarts = Restarts.begin(loads_record(dumps_record(stored)), config, ["vm"])
    attempt = restarts.first_step(5, 114.2, lines.append)
    assert lines == ["restart 1 of 3 after rank 1 died: resumed from step 5, 3 steps lost, 14.2 s to recover"]
    assert attempt == restarts.summary_fields()["attempts"][0]
    fields = restarts.summary_fields()
    assert fields["restarts"] == 1 and list(fields["attempts"][0]) == list(ATTEMPT_KEYS)
    assert DETECTED_AT not in fields["attempts"][0]
    never = Restarts.begin([], config, ["vm"])
    assert never.first_step(0, 1.0, lines.append) is None and len(lines) == 1
    assert never.summary_fields() == {"restarts": 0, "attempts": []}


def test_a_refused_restart_is_a_one_line_error_before_anything_is_built():
    config = parse_flags(["--run-name", "r", "--recovery-budget-s", "5"])
    record = fault("b", at=100.0, record=fault("a", at=0.0))
    with pytest.raises(
        RestartRefusedError, match=r"^1 restarts spent 10 s recovering, --recovery-budget-s 5"
    ):
        Restarts.begin(record, config, ["a", "b"])


def test_a_record_that_is_not_a_list_is_refused():
    with pytest.raises(ValueError, match="not a list of attempts"):
        loads_record(b"{}")


def test_every_preset_restarts_three_times_within_half_an_hour():
    assert {(preset["max_failures"], preset["recovery_budget_s"]) for preset in PRESETS.values()} == {
        (3, 1800.0)
    }


def test_start_timeouts_fit_the_recovery_budget_and_are_at_least_one():
    assert start_retries(1800.0, WORKER_GROUP_START_TIMEOUT_S) == 2
    assert start_retries(60.0, WORKER_GROUP_START_TIMEOUT_S) == 1


# A surviving rank's collective error once its peer's node is gone, as gloo raised it here when a
# worker node's raylet was killed (tests/workloads/training_run/test_runner.py's second-fault test).
GLOO_PEER_LOST = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:18817: Connection reset by peer"
)


def test_a_peer_lost_error_reported_alone_blames_the_rank_gone_silent_not_the_one_that_saw_it():
    """Ray Train's controller can poll the survivor's error before the lost worker's death: the
    fault is on the silent rank's node, which a second fault there refuses and asks to cordon."""
    seen = [WorkerError(1, died=False, kind="RuntimeError", message=GLOO_PEER_LOST)]
    cause, node = fault_cause(seen, HOSTS)
    assert node == "ray-worker-a"
    assert cause.startswith(
        "rank 0 on ray-worker-a stopped answering; rank 1 on ray-worker-b lost it: RuntimeError: "
    )
    assert "Connection reset by peer" in cause


def test_peer_lost_errors_with_no_rank_silent_or_silent_on_two_nodes_leave_the_node_unknown():
    nccl = "NCCL error: remote process exited or there was a network error"
    everyone = [WorkerError(rank, died=False, kind="DistBackendError", message=nccl) for rank in (0, 1)]
    assert fault_cause(everyone, HOSTS) == (
        "rank 0 on ray-worker-a lost a peer: DistBackendError: NCCL error: remote process exited or "
        "there was a network error",
        None,
    )
    four = {0: "a", 1: "a", 2: "b", 3: "c"}
    cause, node = fault_cause([WorkerError(0, False, "DistBackendError", nccl)], four)
    assert node is None and cause.startswith("rank 0 on a lost a peer: ")


def test_an_error_of_its_own_is_the_cause_before_the_peers_it_left_behind():
    errors = [
        WorkerError(0, died=False, kind="RuntimeError", message=GLOO_PEER_LOST),
        WorkerError(1, died=False, kind="OutOfMemoryError", message="CUDA out of memory."),
    ]
    assert fault_cause(errors, HOSTS) == (
        "rank 1 on ray-worker-b raised (and 1 other rank): OutOfMemoryError: CUDA out of memory.",
        "ray-worker-b",
    )


# A lost node under NCCL's error handling (TORCH_NCCL_ASYNC_ERROR_HANDLING=1): ProcessGroupNCCL's
# watchdog tears the survivors' processes down, so Ray Train's controller sees their actors dead of a
# worker-process death, and the lost node's actors dead of their node's death once Ray's GCS declares
# it, or not yet at all (their poll still pending). Ranks 0-3 on node a (the survivor), 4-7 on b.
EIGHT = {rank: "a" if rank < 4 else "b" for rank in range(8)}


def _deaths(ranks, why, *, preempted=False):
    return [worker_error(rank, actor_death(why, preempted=preempted)) for rank in ranks]


def test_a_lost_node_under_nccl_blames_the_lost_node_or_no_node_never_the_survivor():
    survivors = _deaths(range(4), PROCESS_DIED)
    # Both kinds of death polled: the node death comes first, whatever it did to the survivors.
    cause, node = fault_cause([*survivors, *_deaths(range(4, 8), NODE_DIED)], EIGHT)
    assert node == "b" and cause.startswith(
        "node b was lost (rank 4 on b (and 3 other ranks): ActorDiedError: "
    )
    # Only the survivors' deaths polled, and Ray's GCS holds b dead (`lost_nodes`): b.
    cause, node = fault_cause(survivors, EIGHT, lost_nodes={"b"})
    assert node == "b" and cause.startswith("node b was lost (Ray's GCS reports it dead; rank 0 on a")
    # Only the survivors' deaths, b's ranks silent and b not (yet) known dead: the controller waits
    # for the GCS's word first (`awaits_node_deaths`).
    assert awaits_node_deaths(survivors, EIGHT)
    # Deaths on both nodes, no node death and no hang note: the node is unknown, nothing is refused.
    both = [*survivors, *_deaths(range(4, 6), PROCESS_DIED)]
    cause, node = fault_cause(both, EIGHT)
    assert node is None and cause.endswith("(on several nodes: the node is unknown)")
    assert not awaits_node_deaths(both, EIGHT)


def test_a_drained_nodes_workers_name_that_node_and_mark_the_fault_a_drain():
    errors = _deaths(range(4, 8), NODE_DIED, preempted=True)
    assert all(error.preempted and error.node_lost for error in errors)
    cause, node = fault_cause([*errors, *_deaths(range(4), PROCESS_DIED)], EIGHT)
    assert node == "b" and cause.startswith("node b was drained (rank 4 on b")


def test_an_error_a_rank_raised_comes_before_the_deaths_nccl_left_behind():
    """A GPU fault raised on rank 6 (node b) kills every other rank's process under NCCL's error handling."""
    errors = [*_deaths([0, 1, 2, 3, 4, 5, 7], PROCESS_DIED)]
    errors.insert(6, worker_error(6, RuntimeError("CUDA error: an illegal memory access was encountered")))
    cause, node = fault_cause(errors, EIGHT)
    assert node == "b" and cause.startswith(
        "rank 6 on b raised (and 7 other ranks): RuntimeError: CUDA error"
    )
