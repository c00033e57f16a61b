"""Quieter Ray logs (kept tiny: every Ray worker of a local run imports it as a set-up hook)."""

import logging

PLACEMENT_GROUP_CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
# Ray Train names this logger after its file, so RunConfig's log level misses it and
# every ray.train.report call logs a line on every worker.
REPORT_LOGGER_SUFFIX = "ray/train/v2/_internal/execution/context.py"


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
