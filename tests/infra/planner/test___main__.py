"""`python -m infra.planner`: the module runs the planner's command line on the process's arguments and
exits with its status."""

from __future__ import annotations

import json
import runpy
import sys

import pytest


def run_module(monkeypatch, *argv: str) -> SystemExit:
    monkeypatch.setattr(sys, "argv", ["python -m infra.planner", *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("infra.planner", run_name="__main__", alter_sys=False)
    return exited.value


def test_the_module_forecasts_the_stack_its_arguments_name_and_exits_zero(monkeypatch, capsys):
    exited = run_module(monkeypatch, "--stack", "dev", "--json", "--offline")
    assert exited.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in printed["strategies"]] == ["FSDP", "HSDP 2x4"]


def test_the_module_exits_with_the_command_lines_refusal(monkeypatch):
    exited = run_module(monkeypatch, "--stack", "nowhere", "--offline")
    assert "stacks here: dev" in str(exited.code)
