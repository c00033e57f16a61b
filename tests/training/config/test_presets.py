"""The presets (training/config/presets.py): the reference job, and what every preset sets alike."""

from __future__ import annotations

from training.config.presets import PRESETS
from training.config.run_config import SYNTHETIC, parse_args


def test_smoke_preset_is_the_reference_job():
    smoke = PRESETS["smoke"]
    assert (smoke["seq_len"], smoke["batch_size"], smoke["steps"], smoke["data"], smoke["lr"]) == (
        128,
        1,
        5,
        SYNTHETIC,
        2e-5,
    )
    assert smoke["model_id"] == "Qwen/Qwen2.5-1.5B" and smoke["init"] == "pretrained"


def test_grad_accum_steps_is_one_in_every_preset_and_a_flag():
    assert {name: preset["grad_accum_steps"] for name, preset in PRESETS.items()} == dict.fromkeys(PRESETS, 1)
    assert parse_args(["--preset", "throughput", "--grad-accum-steps", "4"]).grad_accum_steps == 4
