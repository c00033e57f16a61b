"""The run's window through the whole program: the deadline the job gets, and the preview's verdict."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pulumi
import pytest

from tests.harness.fake_aws import (
    FakeAws,
    capacity_block,
    capacity_reservation,
)
from tests.harness.preview_queries import (
    NOW,
    RESERVATION,
    RUN_OUTPUTS,
    TRAINING_RUN,
    resolved,
)
from tests.harness.program import (
    Preview,
    dev_config,
    run_program,
)


def block_run(
    monkeypatch,
    starts: timedelta,
    ends: timedelta,
    *,
    recorded: dict[str, dict[str, Any]] | None = None,
    preview: bool = True,
    first_preview: bool = False,
    **config: str,
) -> tuple[Preview, list[tuple[str, str]]]:
    """The program at NOW with a Capacity Block of p5.48xlarge in us-east-2b; its log lines.
    `recorded`, `preview`, `first_preview`: as `run_program` takes them."""
    logged: list[tuple[str, str]] = []
    monkeypatch.setattr(pulumi.log, "info", lambda message, *args, **kwargs: logged.append(("info", message)))
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: logged.append(("warn", message)))
    fake = FakeAws(reservations={RESERVATION: capacity_block("us-east-2b", NOW, starts, ends)})
    settings = {"capacityReservationId": RESERVATION, "gpuNodeType": "p5.48xlarge", **config}
    plan = run_program(
        dev_config(**settings),
        fake,
        now=NOW,
        recorded=recorded,
        preview=preview,
        first_preview=first_preview,
    )
    return plan, logged


def job_deadline(plan: Preview) -> str | None:
    """The job's --deadline, checked to be given at most once."""
    args = plan.one(TRAINING_RUN).inputs["job_args"]
    assert args.count("--deadline") <= 1, args
    return args[args.index("--deadline") + 1] if "--deadline" in args else None


def window_lines(logged: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(level, message) for level, message in logged if message.startswith("run window: ")]


def test_a_block_with_time_to_spare_gives_the_job_its_end_less_40_minutes(monkeypatch):
    plan, logged = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5))
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"  # the block ends at 14:00
    assert plan.one(TRAINING_RUN).inputs.get("not_before") is None
    ((level, line),) = window_lines(logged)
    assert level == "info"
    assert line.startswith(
        f"run window: Capacity Block {RESERVATION} ends at 2026-12-05T14:00:00Z; EKS scales its node group to 0 "
        "at 2026-12-05T13:20:00Z, 40 min before"
    )
    # A fresh stack: the control plane, the nodes, the image and the gate before the first step.
    assert (
        "start-up control plane 15 min, then GPU nodes 5 min + image pull 10 min + fabric gate 1 min: "
        "the job starts about 2026-12-05T09:31:00Z"
    ) in line
    assert "the run fits before --deadline 2026-12-05T13:20:00Z with 3 h 48 min to spare" in line


def test_a_block_too_short_for_the_steps_warns_how_many_fit(monkeypatch):
    plan, logged = block_run(
        monkeypatch, timedelta(hours=-1), timedelta(hours=5), training='{"preset": "smoke", "steps": 200000}'
    )
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"
    ((level, line),) = window_lines(logged)
    fit = re.search(
        r"only (\d+) of the 200000 configured steps fit before --deadline 2026-12-05T13:20:00Z", line
    )
    assert level == "warn" and fit, line
    assert 0 < int(fit.group(1)) < 200000
    assert f"the job stops at its deadline with a checkpoint of step {fit.group(1)}" in line


def test_a_block_ending_before_one_checkpointed_step_is_refused_naming_it_and_its_end():
    fake = FakeAws(
        reservations={
            RESERVATION: capacity_block("us-east-2b", NOW, timedelta(hours=-23), timedelta(hours=1))
        }
    )
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge"), fake, now=NOW)
    message = str(raised.value)
    assert message.startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': Capacity Block {RESERVATION} ends at "
        "2026-12-05T10:00:00Z; EKS scales its node group to 0 at 2026-12-05T09:20:00Z"
    )
    assert "the job starts about 2026-12-05T09:31:00Z, after the deadline" in message
    assert "not even one checkpointed step fits" in message and "\n" not in message
    assert raised.value.plan.of_type(TRAINING_RUN) == []


def test_a_block_starting_within_the_timeout_is_waited_for_by_the_training_run(monkeypatch):
    plan, logged = block_run(monkeypatch, timedelta(minutes=30), timedelta(hours=5))
    assert plan.one(TRAINING_RUN).inputs["not_before"] == "2026-12-05T09:30:00+00:00"
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"
    ((_, line),) = window_lines(logged)
    # The control plane is built meanwhile; the GPU nodes launch at the start.
    assert (
        "start-up control plane 15 min, the block's start at 2026-12-05T09:30:00Z, then GPU nodes 5 min + "
        "image pull 10 min + fabric gate 1 min: the job starts about 2026-12-05T09:46:00Z"
    ) in line


def test_a_block_starting_after_the_timeout_is_refused_with_its_start():
    fake = FakeAws(
        reservations={RESERVATION: capacity_block("us-east-2b", NOW, timedelta(hours=2), timedelta(hours=26))}
    )
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(capacityReservationId=RESERVATION, gpuNodeType="p5.48xlarge"), fake, now=NOW)
    assert str(raised.value).startswith(
        f"config key 'capacityReservationId' = '{RESERVATION}': the Capacity Block starts at 2026-12-05T11:00:00Z, "
        "in 2 h 00 min, and `pulumi up` waits for it at most training.timeoutMinutes (60 min)"
    )
    assert raised.value.plan.resources == []


def test_an_odcr_with_an_end_date_is_the_jobs_deadline_one_without_gives_none(monkeypatch):
    ending = capacity_reservation("us-east-2b", end_date=datetime(2026, 12, 6, 0, 0, tzinfo=UTC))
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION), FakeAws(reservations={RESERVATION: ending}), now=NOW
    )
    assert job_deadline(plan) == "2026-12-06T00:00:00Z"  # a soft end: no 40 minutes kept back
    unlimited = capacity_reservation("us-east-2b")
    plan = run_program(
        dev_config(capacityReservationId=RESERVATION), FakeAws(reservations={RESERVATION: unlimited}), now=NOW
    )
    assert job_deadline(plan) is None


def test_training_deadline_before_the_blocks_end_is_the_jobs_one_deadline(monkeypatch):
    earlier = '{"preset": "smoke", "deadline": "2026-12-05T12:00:00Z"}'
    plan, logged = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5), training=earlier)
    assert job_deadline(plan) == "2026-12-05T12:00:00Z"
    ((_, line),) = window_lines(logged)
    assert line.startswith("run window: training.deadline 2026-12-05T12:00:00Z.")
    later = '{"preset": "smoke", "deadline": "2026-12-05T18:00:00Z"}'
    plan, _ = block_run(monkeypatch, timedelta(hours=-1), timedelta(hours=5), training=later)
    assert job_deadline(plan) == "2026-12-05T13:20:00Z"  # the block's usable end replaces it


def test_a_training_deadline_too_near_is_refused_naming_the_key():
    near = '{"preset": "smoke", "deadline": "2026-12-05T09:10:00Z"}'
    with pytest.raises(pulumi.RunError) as raised:
        run_program(dev_config(training=near), FakeAws(), now=NOW)
    assert str(raised.value).startswith(
        "config key 'training.deadline' = '2026-12-05T09:10:00Z': training.deadline 2026-12-05T09:10:00Z. "
        "Predicted: start-up control plane 15 min"
    )
    assert "not even one checkpointed step fits; set a later training.deadline, or remove it" in str(
        raised.value
    )


# --- a Capacity Block in the window: no hourly price, and Pulumi hands the None back as no key -----

BLOCK_BASIS = f"Capacity Block {RESERVATION}: its upfront fee, paid at purchase whatever the nodes do"


def test_a_first_preview_on_a_block_ending_in_three_days_plans_with_its_window_and_price_basis(monkeypatch):
    """The block is active and ends in three days: the run fits, and its GPU nodes have no hourly price.
    The price's None does not reach the TrainingRun (the SDK drops a None at any depth), and nothing
    reads it as a price."""
    plan, logged = block_run(monkeypatch, timedelta(hours=-1), timedelta(days=3), first_preview=True)
    planned = plan.one(TRAINING_RUN).inputs["planned"]
    assert "usd_per_gpu_node_hour" not in planned and planned["price_basis"].startswith(BLOCK_BASIS)
    ((level, line),) = window_lines(logged)
    assert level == "info" and line.startswith(
        f"run window: Capacity Block {RESERVATION} ends at 2026-12-08T09:00:00Z; EKS scales its node group to 0 "
        "at 2026-12-08T08:20:00Z, 40 min before"
    )
    assert "the run fits before --deadline 2026-12-08T08:20:00Z" in line
    cost = plan.outputs["training"]["cost"]
    assert cost["priceBasis"].startswith(BLOCK_BASIS) and cost["usdPerGpuNodeHour"] is None


def test_a_runs_cost_on_a_block_reads_the_recorded_forecast_without_a_price(monkeypatch):
    """`pulumi up`, then a later preview of the deployed stack (the run unchanged: the engine keeps the
    outputs its state holds): the measured cost counts the nodes' hours with no US$, naming the block;
    the forecast comparison reads the recorded step time."""
    first, _ = block_run(monkeypatch, timedelta(hours=-1), timedelta(days=3), preview=False)
    measured = resolved(first.outputs["training"]["cost"]["measured"])
    assert measured["priceBasis"].startswith(BLOCK_BASIS) and measured["usd"] is None
    inputs = {key: value for key, value in first.one(TRAINING_RUN).inputs.items() if key != "__provider"}
    recorded = {"training": {**inputs, **RUN_OUTPUTS}}
    later, _ = block_run(
        monkeypatch, timedelta(hours=-1), timedelta(days=3), recorded=recorded, preview=False
    )
    measured = resolved(later.outputs["training"]["cost"]["measured"])
    assert (measured["gpuNodeHours"], measured["usd"], measured["usdPerGpuNodeHour"]) == (3.5, None, None)
    assert measured["priceBasis"].startswith(BLOCK_BASIS) and measured["tokens"] == 1_000_000
    compared = resolved(later.outputs["training"]["forecastVsMeasured"])
    assert compared["predictedStepTimeS"] == inputs["planned"]["step_time_s"]
    assert compared["stepTimeRatio"] == round(3.0 / inputs["planned"]["step_time_s"], 3)
    # A state an older release wrote, before the run recorded its forecast: `pulumi up` reads the key the
    # state lacks from the program's own input (pulumi/runtime/rpc.py, `resolve_outputs`: "input prop
    # the engine didn't give us a final value for. Just use the value passed into the resource"), so
    # the cost is at today's basis, and neither read fails.
    older = {"training": {key: value for key, value in recorded["training"].items() if key != "planned"}}
    oldest, _ = block_run(monkeypatch, timedelta(hours=-1), timedelta(days=3), recorded=older, preview=False)
    measured = resolved(oldest.outputs["training"]["cost"]["measured"])
    assert (measured["gpuNodeHours"], measured["usd"]) == (3.5, None)
    assert measured["priceBasis"].startswith(BLOCK_BASIS)
    assert resolved(oldest.outputs["training"]["forecastVsMeasured"])["measuredStepTimeS"] == 3.0
