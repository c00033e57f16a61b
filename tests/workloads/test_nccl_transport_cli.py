"""The command line of the transport verdict: its arguments (its runs are in test_nccl_transport.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from platform_contract import EXPECTABLE_TRANSPORTS
from tests.harness.paths import REPO_ROOT
from workloads.nccl_transport_cli import argument_parser


def test_the_defaults_judge_one_rank_on_one_host_with_no_expectation():
    args = argument_parser().parse_args(["run.log"])
    assert (args.expect, args.ranks, args.hosts, args.logs) == (None, 1, 1, ["run.log"])


def test_every_expectable_transport_is_a_choice_and_counts_are_read():
    for transport in EXPECTABLE_TRANSPORTS:
        args = argument_parser().parse_args(["--expect", transport, "--ranks", "8", "--hosts", "2", "a", "b"])
        assert (args.expect, args.ranks, args.hosts, args.logs) == (transport, 8, 2, ["a", "b"])


@pytest.mark.parametrize("count", ["0", "-1", "two", "1.5"])
def test_a_count_that_is_not_a_whole_number_of_at_least_one_is_refused(count, capsys):
    with pytest.raises(SystemExit) as exited:
        argument_parser().parse_args(["--ranks", count, "run.log"])
    assert exited.value.code == 2
    assert f"must be a whole number of at least 1, not {count!r}" in capsys.readouterr().err


def test_no_log_file_is_refused(capsys):
    with pytest.raises(SystemExit):
        argument_parser().parse_args([])
    assert "usage: python -m workloads.nccl_transport_cli" in capsys.readouterr().err


def test_the_command_line_needs_only_the_standard_library():
    """As the verdict's module: -S hides every site-packages."""
    probe = "import sys; sys.path.insert(0, '.'); import workloads.nccl_transport_cli"

    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=REPO_ROOT, capture_output=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
