"""`workloads/training_run/access/commands.py`: a command's result, and `LocalExecutor`, the stand-in
for a pod that the end-to-end tests drive a real Ray head through (test_runner.py)."""

from __future__ import annotations

import sys

import pytest

from workloads.training_run.access.commands import CommandTimeout, ExecResult, LocalExecutor


def test_a_result_keeps_the_streams_apart_and_joins_them_for_messages():
    result = ExecResult(1, ' {"a": 1}\n', "warning\n")
    assert (result.stdout, result.stderr) == (' {"a": 1}\n', "warning\n")
    assert result.output == '{"a": 1}\nwarning'
    assert ExecResult(0, "", "  ").output == ""


def test_the_local_executor_returns_the_exit_status_and_both_streams(tmp_path):
    program = (
        "import os, sys; print(os.environ['WHO'], os.getcwd()); print('err', file=sys.stderr); sys.exit(3)"
    )
    result = LocalExecutor(env={"WHO": "head"}, cwd=str(tmp_path)).run([sys.executable, "-c", program], 30)
    assert result == ExecResult(3, f"head {tmp_path}\n", "err\n")


def test_a_missing_executable_is_exit_127_as_a_shell_says():
    result = LocalExecutor().run(["no-such-command-here"], 30)
    assert result.returncode == 127
    assert "no-such-command-here" in result.stderr


def test_a_command_past_its_time_limit_stops_in_one_line():
    with pytest.raises(CommandTimeout, match=r"^`.+` did not finish within 0 s$"):
        LocalExecutor().run([sys.executable, "-c", "import time; time.sleep(5)"], 0.2)
