"""A run's Ray Train worker processes, found in /proc under its driver, for the tests that kill one
as a lost node would be lost: only that run's, never a colleague's."""

from __future__ import annotations

import os
import re
from pathlib import Path

# Ray prefixes each line a worker prints with its actor's class and pid; rank 0 prints the steps.
RANK_0_PID = re.compile(r"\(RayTrainWorker pid=(\d+)")
# The process title Ray gives a worker actor's process (`ray::<class>`), which the kill looks for.
WORKER_TITLE = "ray::RayTrainWorker"


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    return children


def train_workers(root: int) -> list[int]:
    """The Ray Train worker processes under `root` (the run's driver, whose embedded Ray started
    them): only this run's, never a colleague's."""
    children, found, todo = _children(), [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            try:
                title = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if title.startswith(WORKER_TITLE):
                found.append(child)
    return found
