"""--deadline's pure pieces: the flag's ISO parsing, the margin, the refusals at start, a rank's
vote on a fake clock, the vote agreed over two gloo ranks whose clocks differ, and the progress line's
time left. Time is a fake clock throughout, never the machine's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.components.deadline import Deadline, deadline_epoch, refusal
from training.config.deadline_margin import (
    ESTIMATED_WRITE_BYTES_PER_S,
    WIND_DOWN_S,
)
from training.config.flag_types import parse_deadline
from training.config.run_config import ArgumentsError, parse_flags
from training.distributed.ballot import StepBallot, step_sync
from training.errors import UsageError
from training.metrics.report import format_duration, format_progress_line

END = "2026-12-05T07:00:00Z"
T_END = deadline_epoch(END)


class SettableClock:
    """Time since the epoch that moves only when the test sets `now`."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        (END, END),
        ("2026-12-05T07:00:00z", END),
        ("2026-12-05T09:00:00+02:00", END),
        ("2026-12-05T07:00:00.250000+00:00", END),
    ],
)
def test_a_deadline_with_its_offset_is_held_as_utc(text, utc):
    assert parse_deadline(text) == utc


@pytest.mark.parametrize(
    ("text", "says"), [("2026-12-05T07:00:00", "no UTC offset"), ("tomorrow", "ISO 8601")]
)
def test_a_deadline_without_offset_or_not_iso_is_refused(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse_deadline(text)


def test_the_flag_names_itself_in_its_error():
    with pytest.raises(ArgumentsError, match="--deadline"):
        parse_flags(["--deadline", "2026-12-05 07:00"])
    assert parse_flags(["--deadline", "2026-12-05T08:00:00+01:00"]).deadline == END
    assert parse_flags([]).deadline is None


def test_a_deadline_past_or_too_near_to_checkpoint_is_refused_naming_the_flag():
    past = refusal(END, T_END + 5, checkpoint_s=0.0)
    assert past is not None and past.startswith("--deadline 2026-12-05T07:00:00Z is past (5 s ago)")
    near = refusal(END, T_END - 80, checkpoint_s=60.0)
    needed = 60 + WIND_DOWN_S
    assert (
        near is not None
        and f"80 s away, less than a checkpoint and the run's end take ({needed:.0f} s)" in near
    )
    assert "\n" not in past + near
    assert refusal(END, T_END - needed - 1, checkpoint_s=60.0) is None


def test_a_rank_votes_to_stop_when_the_next_step_and_checkpoint_would_not_fit():
    clock = SettableClock(T_END - 100)
    deadline = Deadline(END, parameters=0, evaluates=False, clock=clock)
    deadline.record(iteration_s=12.0, eval_s=None, checkpoint_s=10.0)  # a 2 s step + its 10 s checkpoint
    assert deadline.slowest_step_s == 2.0 and deadline.checkpoint_s == 10.0 and deadline.checkpoint_measured
    # 1 s into a step at its all-reduce, 14 s kept back (the 10 s checkpoint and 2 x 2 s) and the wind-down.
    kept = 14.0 + WIND_DOWN_S
    for now, stops in ((T_END - kept, False), (T_END - kept + 0.1, True)):
        clock.now = now - 1.0
        deadline.start_step()
        clock.now = now
        assert deadline.vote() is stops


def test_the_step_now_running_counts_when_it_is_the_slowest():
    clock = SettableClock(T_END - 200 - WIND_DOWN_S)
    deadline = Deadline(END, parameters=0, evaluates=False, clock=clock)
    deadline.start_step()
    # The first step, unmeasured, has run e s: 2e kept back (and the wind-down), so it stops once 3e > 200.
    clock.now += 66.0
    assert not deadline.vote()
    clock.now += 1.0
    assert deadline.vote()


def test_an_evaluating_run_keeps_back_its_evaluation_and_a_step_for_it_before_one_is_timed():
    clock = SettableClock(T_END - 100)
    deadline = Deadline(END, parameters=0, evaluates=True, clock=clock)
    deadline.record(iteration_s=5.0, eval_s=None, checkpoint_s=None)
    deadline.start_step()
    assert deadline.margin_s() == 15.0 + WIND_DOWN_S  # 2 x 5 s and 5 s standing for the evaluation
    deadline.record(iteration_s=35.0, eval_s=30.0, checkpoint_s=None)
    assert deadline.margin_s() == 40.0 + WIND_DOWN_S


def test_an_export_is_estimated_from_the_parameters_in_its_dtype():
    clock = SettableClock(T_END - 1000)
    plain = Deadline(END, parameters=10**9, evaluates=False, clock=clock)
    exporting = Deadline(END, parameters=10**9, evaluates=False, export_dtype="bf16", clock=clock)
    assert exporting.margin_s() - plain.margin_s() == pytest.approx(2e9 / ESTIMATED_WRITE_BYTES_PER_S)


def _ranks(rank: int, init_file: str, out: str) -> None:
    """Rank 0's clock is far from the deadline, rank 1's past its margin: both must stop."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    clock = SettableClock(T_END - (1000.0 if rank == 0 else 5.0 + WIND_DOWN_S))
    deadline = Deadline(END, parameters=0, evaluates=False, clock=clock)
    deadline.record(iteration_s=11.0, eval_s=None, checkpoint_s=10.0)
    deadline.start_step()
    votes = deadline.vote()
    ballot = StepBallot()
    Deadline.register(ballot)
    deadline.cast(ballot)
    step_sync(torch.tensor(1.0), torch.tensor(2.0), ballot)
    agreed = Deadline.agreed(ballot)
    clock.now = T_END + (-1000.0 if rank == 0 else 1.0)
    try:
        deadline.check_start(torch.device("cpu"))
        refused = None
    except UsageError as error:
        refused = str(error)
    Path(out, f"{rank}.json").write_text(json.dumps({"vote": votes, "agreed": agreed, "refused": refused}))
    dist.destroy_process_group()


def test_two_ranks_with_different_clocks_agree_through_the_steps_all_reduce(tmp_path):
    mp.spawn(_ranks, args=(str(tmp_path / "pg"), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert [rank["vote"] for rank in ranks] == [False, True]
    assert [rank["agreed"] for rank in ranks] == [True, True]
    # The start check too: one rank's clock past the deadline refuses the run on both.
    assert all(rank["refused"] for rank in ranks)
    assert "is past" in ranks[1]["refused"]


def test_no_vote_leaves_the_loss_and_norm_as_they_were(one_rank_group):
    ballot = StepBallot()
    Deadline.register(ballot)
    assert (*step_sync(torch.tensor(1.5), torch.tensor(0.5), ballot), Deadline.agreed(ballot)) == (
        1.5,
        0.5,
        False,
    )


@pytest.mark.parametrize(
    ("seconds", "shown"), [(3725.2, "1h02m05s"), (125, "2m05s"), (9.9, "9s"), (-3, "0s")]
)
def test_the_time_left_reads_in_hours_minutes_seconds(seconds, shown):
    assert format_duration(seconds) == shown


def test_the_progress_line_shows_the_time_left_only_with_a_deadline():
    record = {
        "step": 3,
        "steps": 10,
        "loss": 2.0,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "step_time_s": 0.5,
        "tokens_per_s": 100.0,
        "tokens_per_s_per_gpu": 50.0,
        "mfu": None,
        "peak_mem_gib": 0.0,
    }
    assert format_progress_line(record, deadline_left_s=125).endswith(" | 2m05s to deadline")
    assert "deadline" not in format_progress_line(record)
