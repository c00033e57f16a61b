"""The failures the CLI expects: which exit each class takes (a usage error 2, a failed run 1, as
`training.cli` catches them), the one-line report of an exception, and the fix a missing model names."""

from __future__ import annotations

import pytest

from training.errors import (
    MODEL_SOURCE_FIX,
    DivergedError,
    RestartRefusedError,
    RunFailedError,
    UsageError,
    first_line,
)


def test_a_usage_error_is_a_value_error_and_never_a_failed_run():
    assert issubclass(UsageError, ValueError) and not issubclass(UsageError, RunFailedError)


@pytest.mark.parametrize("error", [DivergedError, RestartRefusedError])
def test_a_diverged_run_and_a_refused_restart_are_failed_runs(error):
    assert issubclass(error, RunFailedError) and not issubclass(error, UsageError)


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (RuntimeError("step 12 hung\nstacks follow"), "step 12 hung"),
        (ValueError("\n  padded message\nmore"), "padded message"),
        (OSError(), "OSError"),
        (UsageError("   "), "UsageError"),
    ],
)
def test_the_first_line_of_an_error_or_its_type_when_it_says_nothing(error, line):
    assert first_line(error) == line


def test_the_model_source_fix_names_the_model_and_both_ways_round_the_hub():
    fix = MODEL_SOURCE_FIX.format(name="Qwen/Qwen2.5-1.5B")
    assert "`huggingface-cli download Qwen/Qwen2.5-1.5B`" in fix
    assert "HF_HOME" in fix and fix.endswith("--init random") and "\n" not in fix
