"""The committed picture of the dashboard is the one its definition draws now."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

from infra.resources.dashboard_picture import default_picture, main
from infra.resources.observability import dashboard_body
from tests.harness.paths import REPO_ROOT

PICTURE = REPO_ROOT / "docs" / "dashboard.svg"
SVG = "{http://www.w3.org/2000/svg}"


def test_the_committed_picture_is_drawn_from_the_dashboards_body():
    """Run `python -m infra.resources.dashboard_picture docs/dashboard.svg` after changing the dashboard."""
    assert PICTURE.read_text(encoding="utf-8") == default_picture()


def test_the_picture_has_a_box_per_widget_titled_as_the_widget(tmp_path):
    assert main([str(tmp_path / "dashboard.svg")]) == 0
    root = ElementTree.parse(tmp_path / "dashboard.svg").getroot()
    texts = [text.text for text in root.iter(f"{SVG}text")]
    widgets = dashboard_body("eks-ray-train", "us-east-2", "v6.4.0-eksbuild.1")["widgets"]
    boxes = [rect for rect in root.iter(f"{SVG}rect") if rect.get("rx")]
    assert len(boxes) == len(widgets)
    for widget in widgets[1:]:
        assert widget["properties"]["title"] in texts
