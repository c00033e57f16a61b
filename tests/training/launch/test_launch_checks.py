"""The launching process's checks before any worker starts: a package a flag needs and is not
installed is one line, and a flag that does not need it asks for nothing."""

from __future__ import annotations

import sys

import pytest

from training.config.run_config import parse_flags


def test_float8_without_torchao_is_one_line_before_any_worker(monkeypatch):
    """A None entry in sys.modules makes `import` raise ImportError, as a missing package does."""
    from training.errors import UsageError
    from training.launch.launch_checks import check_packages

    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    check_packages(parse_flags(["--preset", "throughput"]))  # not asked for: not needed
    with pytest.raises(UsageError, match=r"--float8 needs torchao .*pip install torchao==0\.18\.0"):
        check_packages(parse_flags(["--preset", "throughput", "--float8"]))


def test_tensorboard_without_tensorboardx_is_one_line_before_any_worker(monkeypatch):
    """Ray Train depends on tensorboardX; an environment for torchrun alone may lack it."""
    from training.errors import UsageError
    from training.launch.launch_checks import check_packages

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    check_packages(parse_flags(["--no-tensorboard"]))  # not asked for: not needed
    with pytest.raises(UsageError, match=r"^--tensorboard needs tensorboardX .*or pass --no-tensorboard$"):
        check_packages(parse_flags([]))
