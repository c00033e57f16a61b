"""What the in-process test sessions that run `training.loop.train` share of a launcher
(training.session.Session): the answers where nothing restarts, drains or keeps a hang's finding,
and the stubs of a run that writes no checkpoints."""

from __future__ import annotations

from typing import Any

from training.session import Notice


class Uninterrupted:
    def nodes(self) -> list[str]:
        return ["this-node"] * getattr(self, "world_size", 1)  # the in-process ranks share a machine

    def faults(self) -> list[dict[str, Any]]:
        return []  # a run that was never restarted

    def preemption_notice(self) -> Notice | None:
        return None  # no node of the run is being drained

    def note_hang(self, line: str, ranks: tuple[int, ...]) -> None:
        """Nowhere to keep it: the watchdog's own line is the finding."""


class NoCheckpoints:
    """A run whose steps are reported nowhere and that writes no checkpoint (a test's short run)."""

    def report(self, metrics: dict[str, Any], step: int, save: Any) -> None:
        pass

    def checkpoint_folder(self, step: int) -> str:
        raise AssertionError("the test's run writes no checkpoints")

    def publish(self, metrics: dict[str, Any], step: int, folder: str) -> None:
        raise AssertionError("the test's run writes no checkpoints")
