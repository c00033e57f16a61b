"""The job's restarts read from its run summary: the contract's keys, unknown kept unknown, one log line each."""

from __future__ import annotations

from tests.harness.training_run_fakes import LOST_WORKER_ATTEMPT
from workloads.training_run.attempts import ATTEMPT_KEYS, Restarts, attempt_line, restarts_of


def test_the_fake_attempt_has_exactly_the_contracts_keys():
    assert tuple(LOST_WORKER_ATTEMPT) == ATTEMPT_KEYS


def test_restarts_are_read_as_reported_and_a_missing_key_reads_as_none():
    partial = {key: value for key, value in LOST_WORKER_ATTEMPT.items() if key != "recovery_s"}
    found = restarts_of({"restarts": 1, "attempts": [partial]})
    assert found == Restarts(1, [{**LOST_WORKER_ATTEMPT, "recovery_s": None}])


def test_a_summary_without_restarts_is_unknown_not_zero():
    assert restarts_of({"steps": 5}) == Restarts(None, None)
    assert restarts_of({"restarts": 0, "attempts": []}) == Restarts(0, [])
    # Attempts without a count: the count is theirs.
    assert restarts_of({"attempts": [LOST_WORKER_ATTEMPT]}).restarts == 1


def test_an_attempt_is_one_line_naming_its_cause_node_and_lost_steps():
    line = attempt_line("job-1", LOST_WORKER_ATTEMPT)
    assert "\n" not in line
    assert line.startswith("training run: job job-1: restart 1 on ray-train-gpu-workers-worker-b: worker on ")
    assert line.endswith("failed after step 3, resumed from step 2, 1 steps lost, recovered in 41.5 s")
