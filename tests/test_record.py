"""The record stays a record: the benchmark reports under bench/reports/ are dated and frozen, and
the product cites them (a report page, in a comment, docstring or a figure's source) but never reads
them, so re-running a benchmark changes no stack's preview. The measurements the planner
uses are declared figures (`infra/planner/figures.py`), checked against the reports in tests/infra/planner/test_figures.py."""

from __future__ import annotations

import re

import pytest

from tests.harness.paths import REPO_ROOT as ROOT

PRODUCT_PACKAGES = ("infra", "workloads", "training", "policy")
# A mention of bench/ that is not the citation of a report page (bench/reports/<name>.md).
NOT_A_REPORT_PAGE = re.compile(r"bench/(?!reports/[a-z0-9-]+_[a-z0-9-]+_\d{6}\.md\b)")
REPORT_NAME = re.compile(r"[a-z0-9-]+_[a-z0-9-]+_\d{6}")


def product_sources() -> list:
    return [
        path
        for package in PRODUCT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    ] + [ROOT / "__main__.py", ROOT / "platform_contract.py"]


@pytest.mark.parametrize("package", PRODUCT_PACKAGES)
def test_no_product_module_names_a_file_under_bench_but_a_report_page(package):
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in product_sources()
        if path.relative_to(ROOT).parts[0] == package
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NOT_A_REPORT_PAGE.search(line) or re.search(r"^\s*(from|import) bench\b", line)
    ]
    assert found == []


def test_the_check_sees_a_read_of_the_record():
    assert NOT_A_REPORT_PAGE.search('json.loads((ROOT / "bench/reports/x_h200_202612/run.json").read_text())')
    assert NOT_A_REPORT_PAGE.search("bench/results/h200-throughput.json")
    assert not NOT_A_REPORT_PAGE.search("(bench/reports/throughput_h200_202612.md)")


def test_every_report_is_named_topic_hardware_month_with_its_raw_files_beside_it():
    reports = sorted((ROOT / "bench" / "reports").glob("*.md"))
    assert reports
    for report in reports:
        if report.name == "README.md":
            continue
        assert REPORT_NAME.fullmatch(report.stem), report.name
        raw = ROOT / "bench" / "reports" / report.stem
        files = sorted(path.name for path in raw.iterdir())
        assert files, f"{report.name}: no raw files in {raw.name}/"
        text = report.read_text()
        assert [name for name in files if f"]({report.stem}/{name})" not in text] == []
