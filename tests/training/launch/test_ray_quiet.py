"""Ray's logs made quieter: the loggers it turns down, colour codes off on a pipe unless the user
chose, and Ray's known noise dropped from the worker lines the driver prints (on Ray's own
dispatcher of forwarded output, a fresh one for each test)."""

from __future__ import annotations

import logging

import pytest

from training.launch import ray_quiet
from training.launch.ray_quiet import (
    COLOR_PREFIX_ENV,
    KNOWN_NOISE,
    PLACEMENT_GROUP_CLEANER_LOGGER,
    PRINT_LOGS_HANDLER,
    REPORT_LOGGER_SUFFIX,
    without_known_noise,
)

NOISE = f"(RayTrainWorker pid=7) [core_worker.cc:2011] {KNOWN_NOISE[0]} has max_restarts set"
LINE = "(RayTrainWorker pid=7) TRAIN_STEP step=1"


@pytest.fixture
def logger_levels():
    """The loggers' levels as they were, restored after the test."""
    names = [PLACEMENT_GROUP_CLEANER_LOGGER, f"/opt/site-packages/{REPORT_LOGGER_SUFFIX}", "ray.data"]
    levels = {name: logging.getLogger(name).level for name in names}
    yield names
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_the_placement_group_cleaner_keeps_only_its_errors_and_the_report_logger_its_warnings(logger_levels):
    cleaner, report, _ = logger_levels
    logging.getLogger(report).setLevel(logging.INFO)
    ray_quiet.quiet_placement_group_cleaner()
    ray_quiet.quiet_report_logger()
    assert logging.getLogger(cleaner).level == logging.ERROR
    assert logging.getLogger(report).level == logging.WARNING


def test_worker_lines_lose_their_colour_on_a_pipe_unless_the_user_chose(monkeypatch):
    """NO_COLOR set counts as a pipe, whether or not pytest captures the output."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv(COLOR_PREFIX_ENV, raising=False)
    ray_quiet.plain_prefixes_unless_terminal()
    assert ray_quiet.os.environ[COLOR_PREFIX_ENV] == "0"
    monkeypatch.setenv(COLOR_PREFIX_ENV, "1")
    ray_quiet.plain_prefixes_unless_terminal()
    assert ray_quiet.os.environ[COLOR_PREFIX_ENV] == "1"


def test_only_the_known_noise_is_dropped():
    assert without_known_noise([NOISE, LINE, "plain"]) == [LINE, "plain"]


def test_the_drivers_printer_drops_the_noise_and_a_batch_of_noise_alone(monkeypatch, logger_levels):
    from ray._private import ray_logging

    dispatcher = ray_logging.WorkerStandardStreamDispatcher()
    monkeypatch.setattr(ray_logging, "global_worker_stdstream_dispatcher", dispatcher)
    printed: list[dict] = []
    dispatcher.add_handler(PRINT_LOGS_HANDLER, printed.append)
    ray_quiet.quiet_driver_logs()
    dispatcher.emit({"pid": 7, "lines": [NOISE, LINE]})
    dispatcher.emit({"pid": 7, "lines": [NOISE]})
    assert printed == [{"pid": 7, "lines": [LINE]}]
    assert [name for name, _ in dispatcher.handlers] == [PRINT_LOGS_HANDLER]
    assert logging.getLogger("ray.data").level == logging.WARNING


def test_without_the_drivers_printer_nothing_is_added(monkeypatch, logger_levels):
    """With log_to_driver off Ray registers no printer: there is nothing to filter."""
    from ray._private import ray_logging

    dispatcher = ray_logging.WorkerStandardStreamDispatcher()
    monkeypatch.setattr(ray_logging, "global_worker_stdstream_dispatcher", dispatcher)
    ray_quiet.quiet_driver_logs()
    assert dispatcher.handlers == []
