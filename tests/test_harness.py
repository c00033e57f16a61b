"""docs/test-fakes.md, the map of the test fakes, against tests/harness/: every file there is on the
map, and every file the map names is there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.paths import REPO_ROOT

HARNESS = REPO_ROOT / "tests" / "harness"
MAP = REPO_ROOT / "docs" / "test-fakes.md"


def mapped_files(page: Path = MAP) -> list[str]:
    """The file named in the first cell of each table row of the map."""
    return [
        match.group(1)
        for line in page.read_text().splitlines()
        if (match := re.match(r"\| `([\w.]+\.py)` \|", line))
    ]


def test_every_harness_file_is_on_the_map_of_the_fakes():
    files = sorted(path.name for path in HARNESS.glob("*.py") if path.name != "__init__.py")
    assert sorted(set(files) - set(mapped_files())) == []


def test_the_map_of_the_fakes_names_only_files_the_harness_holds():
    named = mapped_files()
    assert sorted(name for name in named if not (HARNESS / name).exists()) == []
    assert len(named) == len(set(named)), "a file is on the map twice"


def test_the_map_check_sees_a_file_missing_from_the_harness(tmp_path):
    page = tmp_path / "test-fakes.md"
    page.write_text("| file | stands in for |\n| --- | --- |\n| `fake_nothing.py` | nothing |\n")
    assert mapped_files(page) == ["fake_nothing.py"]
    assert not (HARNESS / "fake_nothing.py").exists()
