"""A drain's checkpoint at the cluster's sizes, and the choice a notice makes: the size, the rate and the
step are parameters, so the arithmetic is held at Qwen2.5-1.5B on 2 x g6.12xlarge as well as beside it."""

from __future__ import annotations

import pytest

from training.config.drain_budget import (
    COMMIT_S,
    MAX_GRACE_S,
    NOTICE_S,
    RAY_STOP_MARGIN_S,
    STREAM_BYTES_PER_S,
    drain_budget,
    drain_choice,
)

QWEN_1_5B = 1_543_714_304  # parameters of Qwen2.5-1.5B (training/architectures/qwen2.5-1.5b.json)
GIB = 1 << 30


def test_the_clusters_drain_writes_9_gib_a_node_in_half_a_minute_and_the_grace_holds_it():
    budget = drain_budget(QWEN_1_5B, nodes=2, ranks_per_node=4, step_s=5.0)
    assert budget.bytes_per_node / GIB == pytest.approx(8.63, abs=0.01)  # 18.5 GB over two nodes
    assert budget.write_s == pytest.approx(budget.bytes_per_node / 4 / STREAM_BYTES_PER_S)
    assert 25 < budget.write_s < 30
    assert budget.worst_s == pytest.approx(NOTICE_S + 5.0 + budget.stage_s + budget.write_s + COMMIT_S)
    assert budget.worst_s < budget.grace_s - RAY_STOP_MARGIN_S == budget.drain_timeout_s
    assert budget.fits and budget.grace_s <= MAX_GRACE_S


@pytest.mark.parametrize(("rate", "streams"), [(STREAM_BYTES_PER_S, 4), (125 * (1 << 20), 1)])
def test_the_grace_grows_with_a_slower_link_and_holds_the_worst_case(rate, streams):
    """The size and the rate as parameters: 9 GiB a node through four S3 streams, or one 125 MiB/s link."""
    budget = drain_budget(
        round(9 * GIB / 12), nodes=1, ranks_per_node=streams, step_s=5.0, rate_bytes_per_s=rate
    )
    assert budget.worst_s < budget.drain_timeout_s and budget.fits


def test_one_node_of_a_seven_billion_model_does_not_fit_the_five_minutes_eks_waits():
    assert not drain_budget(7_600_000_000, nodes=1, ranks_per_node=4, step_s=10.0).fits


@pytest.mark.parametrize(
    ("left_s", "in_flight_left_s", "next_write_s", "choice"),
    [
        (100.0, 20.0, 30.0, (True, False)),  # the write in flight commits in time: nothing new
        (100.0, 97.0, 30.0, (False, False)),  # it cannot, and a new write would end after it
        (100.0, None, 30.0, (False, True)),  # none in flight: the drain's own write
        (20.0, None, 30.0, (False, False)),  # too late for any write
        (None, 20.0, 30.0, (True, True)),  # no deadline (torchrun's SIGTERM): both, as before
        (None, None, 30.0, (False, True)),
    ],
)
def test_a_notice_commits_what_can_commit_before_its_deadline(left_s, in_flight_left_s, next_write_s, choice):
    made = drain_choice(left_s, in_flight_left_s, next_write_s)
    assert (made.commit_in_flight, made.write) == choice
