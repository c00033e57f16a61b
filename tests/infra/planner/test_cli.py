"""`python -m infra.planner`: the forecast of a stack file, as JSON or text, and its errors."""

from __future__ import annotations

import json

import pytest

from infra.planner import cli


def test_the_dev_stack_forecasts_as_json(capsys):
    assert cli.main(["--stack", "dev", "--json", "--offline"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["line_rate_gbps"] == 40
    assert [row["name"] for row in printed["strategies"]] == ["FSDP", "HSDP 2x4"]
    for row in printed["strategies"]:
        assert set(row) >= {
            "name",
            "inter_node_bytes_per_step",
            "step_time_s",
            "tokens_per_s",
            "usd_per_million_tokens",
        }


def test_a_lower_line_rate_lowers_tokens(capsys):
    cli.main(["--stack", "dev", "--json", "--offline"])
    efa = json.loads(capsys.readouterr().out)
    cli.main(["--stack", "dev", "--json", "--offline", "--line-rate-gbps", "10"])
    tcp = json.loads(capsys.readouterr().out)
    assert tcp["line_rate_gbps"] == 10
    for fast, slow in zip(efa["strategies"], tcp["strategies"], strict=True):
        assert slow["tokens_per_s"] < fast["tokens_per_s"]


def test_the_text_forecast_marks_the_configured_strategy_and_warns(capsys):
    cli.main(["--stack", "dev", "--offline"])
    out = capsys.readouterr().out
    assert " *FSDP " in out  # the smoke preset runs plain FSDP (hsdpReplicas 1)
    assert (
        "warning: the training job is predicted network-bound" in out
        and "HSDP (training.hsdpReplicas: auto)" in out
    )


def test_an_unknown_stack_names_the_stacks_there():
    with pytest.raises(SystemExit, match="stacks here: dev"):
        cli.main(["--stack", "nowhere", "--offline"])
