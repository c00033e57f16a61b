"""A picture of the dashboard's layout, drawn from its body: each widget where CloudWatch places it
on its 24-column grid, with its title and the metrics it graphs, coloured by who emits them.

`python -m infra.resources.dashboard_picture docs/dashboard.svg` draws the default stack's
(`tests/infra/resources/test_dashboard_picture.py` fails while the committed picture differs).
"""

from __future__ import annotations

import re
import sys
from html import escape
from pathlib import Path
from typing import Any

from infra.aws_rules.container_insights import METRIC_NAMESPACE
from infra.config.stack import StackKeys
from infra.resources.observability import GRID_COLUMNS, dashboard_body
from training.metrics.cloudwatch_metrics import NAMESPACE as JOB_NAMESPACE

COLUMN_PX, ROW_PX, MARGIN_PX, GAP_PX = 48, 30, 16, 4
LEGEND_PX = 50
FILL = {METRIC_NAMESPACE: "#dbe9f6", JOB_NAMESPACE: "#fde7cf", "text": "#f2f2f2"}
STROKE = {METRIC_NAMESPACE: "#2f6ea3", JOB_NAMESPACE: "#c0701a", "text": "#8a8a8a"}
WHO = {
    METRIC_NAMESPACE: "the nodes: Container Insights, from the CloudWatch Observability add-on",
    JOB_NAMESPACE: "the run: the training job's rank 0 and the fabric gate's probe",
}
_SEARCH = re.compile(
    r"SEARCH\('\{(?P<namespace>[^,}]+)[^}]*\} MetricName=\"(?P<metric>[^\"]+)\"[^']*', '(?P<stat>\w+)', \d+\)"
    r"(?P<math>.*)"
)
# What the picture shows for the stack's add-on version, which EKS names at preview.
VERSION_SHOWN = "(the version pinned at preview)"


def _text(
    x: float, y: float, content: str, size: int, weight: str = "normal", colour: str = "#1b1b1b"
) -> str:
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="{size}" '
        f'font-weight="{weight}" fill="{colour}">{escape(content)}</text>'
    )


def _sketch(x: float, y: float, width: float, height: float, view: str, lines: int, colour: str) -> list[str]:
    """A drawing of what the widget shows: an axis and one line per series, or a number."""
    if view == "singleValue":
        return [_text(x + 10, y + height - 18, "one number per collective, the latest", 15, "bold", colour)]
    left, bottom, right, top = x + 10, y + height - 12, x + width - 10, y + height * 0.55
    parts = [f'<path d="M{left:.0f} {top:.0f} V{bottom:.0f} H{right:.0f}" stroke="#9a9a9a" fill="none"/>']
    for series in range(lines):
        points = [
            (
                left + (right - left) * step / 8,
                bottom - (bottom - top) * (0.35 + 0.25 * series + 0.1 * ((step + series) % 3)),
            )
            for step in range(9)
        ]
        path = " ".join(f"{px:.0f},{py:.0f}" for px, py in points)
        parts.append(f'<polyline points="{path}" stroke="{colour}" stroke-width="1.5" fill="none"/>')
    return parts


def _widget(widget: dict[str, Any]) -> list[str]:
    x = MARGIN_PX + widget["x"] * COLUMN_PX + GAP_PX / 2
    y = MARGIN_PX + widget["y"] * ROW_PX + GAP_PX / 2
    width, height = widget["width"] * COLUMN_PX - GAP_PX, widget["height"] * ROW_PX - GAP_PX
    properties = widget["properties"]
    sketch: list[str] = []
    if widget["type"] == "text":
        kind = "text"
        lines = [line.lstrip("# ").replace("`", "") for line in properties["markdown"].splitlines()]
        title, body = lines[0], [part for line in lines[1:] for part in _wrap(line, width, 11)]
    else:
        searches = [_SEARCH.search(entry[0]["expression"]) for entry in properties["metrics"]]
        kind = searches[0]["namespace"] if searches[0] else "text"
        title = properties["title"]
        body = [
            part
            for m in searches
            if m
            for part in _wrap(f"{m['metric']} ({m['stat']}{m['math']})", width, 11)
        ]
        sketch = _sketch(
            x, y, width, height, properties.get("view", "timeSeries"), len(searches), STROKE[kind]
        )
    parts = [
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{width:.0f}" height="{height:.0f}" rx="6" '
        f'fill="{FILL[kind]}" stroke="{STROKE[kind]}" stroke-width="1.5"/>',
        _text(x + 10, y + 22, title, 13, "bold"),
    ]
    parts += [
        _text(x + 10, y + 42 + 16 * index, line, 11, colour="#3a3a3a") for index, line in enumerate(body)
    ]
    return parts + sketch


def _wrap(line: str, width_px: float, size: int) -> list[str]:
    """Words on lines that fit `width_px` at about 0.55 em a character."""
    per_line = max(1, int((width_px - 20) / (0.55 * size)))
    lines, current = [], ""
    for word in line.split():
        if current and len(current) + 1 + len(word) > per_line:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return [*lines, current] if current else lines


def render_svg(body: dict[str, Any]) -> str:
    """The layout of `body` (a dashboard body) as an SVG document."""
    rows = max(widget["y"] + widget["height"] for widget in body["widgets"])
    width = 2 * MARGIN_PX + GRID_COLUMNS * COLUMN_PX
    height = 2 * MARGIN_PX + rows * ROW_PX + LEGEND_PX
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    for widget in body["widgets"]:
        parts += _widget(widget)
    for index, namespace in enumerate(WHO):
        legend_y = MARGIN_PX + rows * ROW_PX + 20 + 20 * index
        parts.append(
            f'<rect x="{MARGIN_PX}" y="{legend_y - 11}" width="14" height="14" fill="{FILL[namespace]}" '
            f'stroke="{STROKE[namespace]}"/>'
        )
        parts.append(_text(MARGIN_PX + 20, legend_y, f"{namespace}: {WHO[namespace]}", 12))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def default_picture() -> str:
    """The default stack's dashboard (its cluster name, the dev stack's region)."""
    cluster = StackKeys.model_fields["cluster_name"].default
    return render_svg(dashboard_body(cluster, "us-east-2", VERSION_SHOWN))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m infra.resources.dashboard_picture OUTPUT.svg", file=sys.stderr)
        return 2
    Path(args[0]).write_text(default_picture(), encoding="utf-8")
    print(f"wrote {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
