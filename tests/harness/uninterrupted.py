"""What a launcher that never restarts, drains or keeps a hang's finding answers the loop
(training.session.Session's `faults`, `preemption_notice`, `note_hang`): the in-process test
sessions that run `training.loop.train` take these from here."""

from __future__ import annotations

from typing import Any

from training.session import Notice


class Uninterrupted:
    def faults(self) -> list[dict[str, Any]]:
        return []  # a run that was never restarted

    def preemption_notice(self) -> Notice | None:
        return None  # no node of the run is being drained

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """Nowhere to keep it: the watchdog's own line is the finding."""
