"""Durations in words, as the preview's messages write them."""

from __future__ import annotations


def span(seconds: float) -> str:
    """`2 h 05 min`, `14 min`, `40 s`."""
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
