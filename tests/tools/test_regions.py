"""Generated regions are found by their BEGIN/END GENERATED markers alone, and one command rewrites them all."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.harness.paths import REPO_ROOT as ROOT
from tools import catalogues, config_tables, docs
from tools.__main__ import main
from tools.regions import MissingRegion, begin, end, names, replace_regions

DOCUMENT = "# Page\n\nProse the generator never reads.\n\n<!-- BEGIN GENERATED: rows -->\n| a |\n| --- |\n| 1 |\n<!-- END GENERATED: rows -->\n\nAfter.\n"


def test_a_region_is_replaced_between_its_markers_and_nothing_else_moves():
    rewritten = replace_regions(DOCUMENT, {"rows": "| a |\n| --- |\n| 2 |\n"}, "docs/page.md")
    assert rewritten == DOCUMENT.replace("| 1 |", "| 2 |")


def test_the_prose_around_a_region_may_change_freely():
    edited = DOCUMENT.replace("Prose the generator never reads.", "Other words entirely:")
    assert replace_regions(edited, {"rows": "| a |\n| --- |\n| 1 |\n"}, "docs/page.md") == edited


@pytest.mark.parametrize(
    "broken",
    [
        DOCUMENT.replace(begin("rows") + "\n", ""),
        DOCUMENT.replace(end("rows") + "\n", ""),
        DOCUMENT + begin("rows") + "\n",
        DOCUMENT.replace(begin("rows"), "@@").replace(end("rows"), begin("rows")).replace("@@", end("rows")),
    ],
    ids=["no begin", "no end", "twice", "out of order"],
)
def test_a_missing_marker_fails_in_one_line_naming_the_file_and_the_command(broken):
    with pytest.raises(MissingRegion) as failure:
        replace_regions(broken, {"rows": "| a |\n"}, "docs/page.md")
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("docs/page.md: the generated region 'rows' ")
    assert message.endswith("run `python -m tools docs`")


def test_the_command_says_in_one_line_which_document_lost_a_marker(monkeypatch, capsys, tmp_path):
    broken = tmp_path / "configuration.md"
    broken.write_text(config_tables.CONFIGURATION.read_text().replace(begin("judging-keys") + "\n", ""))
    monkeypatch.setattr(docs, "rewriters", lambda: {broken: config_tables.rewritten})
    assert main(["docs"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("docs/configuration.md: the generated region 'judging-keys' ")
    assert error.count("\n") == 1
    assert broken.read_text().count(end("judging-keys")) == 1  # nothing written


def test_every_marked_region_of_the_documents_has_a_generator_and_every_generator_a_region():
    """One entry point: the documents it rewrites are every document with a marker, and each region
    it generates is marked exactly where its document marks it."""
    marked = {
        path: names(path.read_text())
        for path in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("policy/**/*.md")]
        if re.search(r"^<!-- (BEGIN|END) GENERATED", path.read_text(), flags=re.MULTILINE)
    }
    generated = {document: list(regions) for document, regions in catalogues.tables().items()}
    generated[config_tables.CONFIGURATION] = list(config_tables.tables())
    assert marked == generated
    assert docs.rewriters().keys() == generated.keys()


def test_the_documents_are_as_the_command_writes_them():
    assert docs.stale() == []
    assert set(docs.generated()) == {*docs.rewriters(), *docs.DRAWN}
    assert main(["docs", "--check"]) == 0


def test_the_command_runs_as_a_user_types_it():
    """`python -m tools docs --check` from the repository's root, as docs/testing.md gives it."""
    done = subprocess.run(
        [sys.executable, "-m", "tools", "docs", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
