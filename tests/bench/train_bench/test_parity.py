"""The parity report of two runs: how far a candidate's loss curve lies from the baseline's."""

from __future__ import annotations

from bench.train_bench.parity import parity_report


def test_a_parity_report_says_how_far_the_candidate_curve_lies_from_the_baseline():
    curves = {"sdpa": [4.0, 3.0, 2.0, 1.0, 1.0], "flex": [4.0, 3.5, 2.0, 1.0, 1.5]}
    report = parity_report("flex-parity", {"seq": 8}, 5, curves, {}, "sdpa", "flex")
    assert (report["name"], report["seq"], report["steps"]) == ("flex-parity", 8, 5)
    assert report["loss_first"] == {"sdpa": 4.0, "flex": 4.0}
    assert report["loss_last"] == {"sdpa": 1.0, "flex": 1.5}
    assert report["mean_loss_last_1_steps"] == {"sdpa": 1.0, "flex": 1.5}  # the last fifth: 1 step
    assert report["relative_difference_last_steps"] == 0.5
    assert report["mean_difference"] == 0.2 and report["max_abs_difference"] == 0.5


def test_with_another_seeds_baseline_the_report_gives_the_seed_to_seed_spread():
    curves = {"bf16": [4.0, 2.0], "bf16-seed-1": [4.0, 3.0], "float8": [4.0, 2.5]}
    report = parity_report("float8-parity", {}, 2, curves, {}, "bf16", "float8", "bf16-seed-1")
    assert report["relative_difference_last_steps"] == 0.25
    assert report["seed_spread_last_steps"] == 0.5
    assert "seed_spread_last_steps" not in parity_report("p", {}, 2, curves, {}, "bf16", "float8")
