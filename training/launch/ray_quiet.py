"""Quieter Ray logs (kept tiny: every Ray worker of a local run imports it as a set-up hook)."""

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

PLACEMENT_GROUP_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
# Ray Train names this logger after its file, so RunConfig's log level misses it and
# every ray.train.report call logs a line on every worker.
REPORT_LOGGER_SUFFIX = "ray/train/v2/_internal/execution/context.py"
# Ray wraps the "(RayTrainWorker pid=…)" prefix of forwarded worker lines in colour
# codes unless this variable is "0" (read by ray._private.worker.print_worker_logs).
COLOR_PREFIX_ENV = "RAY_COLOR_PREFIX"
# Name under which ray.init registers the driver's printer of forwarded worker output.
PRINT_LOGS_HANDLER = "ray_print_logs"
# Worker lines that are error-level in form only, dropped before they reach the console:
# Ray Train's controller always creates its PreemptionWatcher actor with restarts and
# object-store arguments, so Ray's core worker warns about it on every run
# (ray-project/ray#53727, which the line itself links); nothing can be done about it here.
KNOWN_NOISE = ("Actor with class name: 'PreemptionWatcher'",)


def quiet_placement_group_cleaner() -> None:
    """Locally Ray runs without its dashboard, which costs seconds to start. Ray Train's
    placement-group cleaner asks the dashboard's state API about the controller every
    second and warns each time it cannot; its cleanup is moot locally, where the whole
    cluster ends with the driver, so only its errors are kept."""
    logging.getLogger(PLACEMENT_GROUP_CLEANER_LOGGER).setLevel(logging.ERROR)


def quiet_report_logger() -> None:
    """Drop the per-report INFO line; the loop prints its own step lines."""
    for name in list(logging.root.manager.loggerDict):
        if name.endswith(REPORT_LOGGER_SUFFIX):
            logging.getLogger(name).setLevel(logging.WARNING)


def plain_prefixes_unless_terminal() -> None:
    """No colour codes in forwarded worker lines when the output goes to a pipe or a
    file (or NO_COLOR is set); a value the user set wins. Call before ray.init."""
    terminal = sys.stdout.isatty() and sys.stderr.isatty() and "NO_COLOR" not in os.environ
    if not terminal:
        os.environ.setdefault(COLOR_PREFIX_ENV, "0")


def without_known_noise(lines: list[str]) -> list[str]:
    return [line for line in lines if not any(noise in line for noise in KNOWN_NOISE)]


def quiet_driver_logs() -> None:
    """Call after ray.init: filter KNOWN_NOISE out of the worker output the driver prints,
    and keep Ray Data's per-execution INFO lines (plan, start, finish) off the console."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    printers = [handler for name, handler in dispatcher.handlers if name == PRINT_LOGS_HANDLER]
    if not printers:  # log_to_driver is off: nothing is printed
        return
    printer: Callable[[dict[str, Any]], None] = printers[0]

    def print_without_noise(batch: dict[str, Any]) -> None:
        lines = without_known_noise(batch.get("lines", []))
        if lines:
            printer({**batch, "lines": lines})

    dispatcher.remove_handler(PRINT_LOGS_HANDLER)
    dispatcher.add_handler(PRINT_LOGS_HANDLER, print_without_noise)
