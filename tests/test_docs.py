"""The documentation stays true to the code: links resolve, tables match what the program does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pulumi
import pytest
import yaml

from infra.config.parsing import key_names
from infra.config.stack import StackKeys
from infra.config.training_settings import setting_keys
from tests.harness.fake_aws import FakeAws
from tests.harness.program import ROOT, dev_config, run_program
from tools import catalogues
from tools.config_tables import rewritten
from workloads import training_run
from workloads.training_run.provider import GATE, TOP, benchmark_output_keys, training_output_keys

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README_MAX_BYTES = 12 * 1024
# The index of the dated benchmark record (bench/reports/), which may tell what an earlier run found;
# every other page is the reference, which says what the code does today.
RECORD = {ROOT / "docs" / "benchmarks.md"}
REFERENCE = [document for document in DOCUMENTS if document not in RECORD]
PAGE_MAX_LINES = 250
# Words that narrate a change instead of stating what is true: history goes to CHANGELOG.md, what an
# existing stack must do to UPGRADING.md.
HISTORY = re.compile(
    r"\b(now|no longer|used to|any ?more|previous(ly)?|formerly|another lease|"
    r"before these|as before|of before|the old (driver|path))\b|\bbefore: ",
    flags=re.IGNORECASE,
)
# Markdown links and images: [text](target) and ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"^`(.*)`$")


def relative_links(document: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.DOTALL)  # code holds no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+:", target)]


def anchors(document: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", document.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def page_id(path: Path) -> str:
    """A page's path under docs/ (README.md for the README)."""
    return str(path.relative_to(ROOT / "docs")) if path.is_relative_to(ROOT / "docs") else path.name


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    """Relative links whose file is missing or outside `root`, or whose anchor is no heading there."""
    broken = []
    for target in relative_links(document):
        path, _, fragment = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if (
            not resolved.exists()
            or not resolved.is_relative_to(root)
            or (fragment and resolved.suffix == ".md" and fragment not in anchors(resolved))
        ):
            broken.append(target)
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=page_id)
def test_every_relative_link_resolves(document):
    assert broken_links(document) == []


# Pages outside the reference whose links must hold too: the history, the upgrade notes, the record.
OTHER_PAGES = [
    ROOT / "CHANGELOG.md",
    ROOT / "UPGRADING.md",
    ROOT / "policy" / "README.md",
    *sorted((ROOT / "bench" / "reports").glob("*.md")),
]


@pytest.mark.parametrize("page", OTHER_PAGES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_of_the_history_and_the_record_resolves(page):
    assert broken_links(page) == []


def test_link_check_catches_a_missing_file(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[gone](missing.md) and [web](https://example.com) and `[code](nowhere.md)`\n")
    assert relative_links(page) == ["missing.md"]


def test_link_check_catches_a_missing_anchor_in_another_page(tmp_path):
    """A page moved into a folder keeps its links only if each file and heading is still there."""
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[there](guide/other.md#a-section) [gone](guide/other.md#no-such-section) [old](other.md#a-section)\n"
    )
    assert broken_links(page, root=tmp_path) == ["guide/other.md#no-such-section", "other.md#a-section"]


def prose(document: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks and code spans, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, re.sub(r"`[^`]*`", "", line)))
    return lines


@pytest.mark.parametrize("document", REFERENCE, ids=page_id)
def test_a_reference_page_holds_one_topic(document):
    """At most about 250 lines a page: a longer one is split into a folder of pages."""
    assert len(document.read_text().splitlines()) <= PAGE_MAX_LINES


@pytest.mark.parametrize("document", REFERENCE, ids=page_id)
def test_the_reference_states_what_is_true_today(document):
    """No "now", "no longer", "used to", "before these changes" ...: a reader must not decode
    history to learn current behaviour."""
    assert [f"{number}: {line}" for number, line in prose(document) if HISTORY.search(line)] == []


def test_the_history_check_catches_narration_and_spares_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "The probe no longer runs after the job.\n9.87 GiB before, 4.18 GiB now.\n"
        "It stops before the job is submitted.\n`--known-now` and\n```\nnow = clock()\n```\n"
    )
    assert [number for number, line in prose(page) if HISTORY.search(line)] == [1, 2]


def test_readme_stays_short():
    assert (ROOT / "README.md").stat().st_size < README_MAX_BYTES


@pytest.mark.parametrize("document", DOCUMENTS, ids=page_id)
def test_no_document_cites_a_file_the_repository_lacks(document):
    assert not re.search(r"\bSPEC\b|the spec's", document.read_text())


def table(document: Path, heading: str, index: int = 0) -> list[list[str]]:
    """Rows of the `index`-th table under `heading` (before the next heading), as lists of cell
    texts (header and rule dropped)."""
    section = document.read_text().split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    end = 0
    for _ in range(index + 1):
        start = next(i for i in range(end, len(lines)) if lines[i].startswith("|"))
        end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip().split("|")[1:-1]] for line in lines[start + 2 : end]]


def code(cell: str) -> str | None:
    match = CODE_SPAN.match(cell)
    return match.group(1) if match else None


def test_key_tables_are_generated_from_the_declaration():
    """The stack keys, the judging keys and the program's flags, as `python -m tools docs`
    writes them from the code (run it after changing a key)."""
    document = CONFIGURATION.read_text()
    assert document == rewritten(document)


def test_the_table_generator_replaces_a_stale_row():
    document = CONFIGURATION.read_text()
    stale = document.replace("| `workerCpu` | `40` |", "| `workerCpu` | `48` |")
    assert stale != document
    assert rewritten(stale) == document


def test_every_key_of_the_declaration_is_in_the_table():
    documented = [code(row[0]) for row in table(CONFIGURATION, "## Stack keys")]
    assert documented == ["aws:region", *key_names(StackKeys)]


def test_often_set_training_keys_are_flags_of_the_job():
    often = table(CONFIGURATION, "## `training` keys")
    assert [code(row[0]) for row in often if code(row[0]) not in setting_keys()] == []


# Inputs of the bad-input table that are not config keys: the fake account they describe.
ACCOUNTS = {
    "`eks:DescribeCluster` denied to the identity": {"denied": {"aws:eks/getCluster:getCluster"}},
    "a vCPU quota of 48 for `L-DB2E81BA`": {"quotas": {"L-DB2E81BA": 48}},
}


def bad_input_cases() -> list[tuple[str, str]]:
    return [(row[0], row[1]) for row in table(CONFIGURATION, "## Bad input")]


@pytest.mark.parametrize(("given", "message"), bad_input_cases(), ids=[row[0] for row in bad_input_cases()])
def test_bad_input_table_shows_the_real_message(given, message):
    """Each row, set on top of Pulumi.dev.yaml, fails with the message the table shows."""
    config = dev_config()
    account: dict = ACCOUNTS.get(given, {})
    if given not in ACCOUNTS:
        assert code(given), f"input {given!r} is neither a `key: value` nor a known account"
        for key, value in yaml.safe_load(code(given)).items():
            name = key if ":" in key else f"eks-ray-train:{key}"
            config[name] = value if isinstance(value, str) else json.dumps(value)
    expected = code(message)
    assert expected, f"message {message!r} is not a code span"
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    region = config["aws:region"] if re.match(r"^[a-z]{2}-[a-z]+-\d$", config["aws:region"]) else "us-east-2"
    with pytest.raises(pulumi.RunError) as failure:
        run_program(config, FakeAws(region=region, **account))
    assert re.search(pattern, str(failure.value), flags=re.DOTALL), str(failure.value)


@pytest.mark.parametrize("document", sorted(catalogues.tables()), ids=lambda path: path.name)
def test_catalogues_are_generated_from_their_declarations(document):
    """The policy rules, the chart pins and the layers, as `python -m tools docs` writes them from
    the code (run it after changing a rule, a pin or a layer)."""
    assert document.read_text() == catalogues.rewritten(document, document.read_text())


def test_the_catalogue_generator_replaces_a_stale_row():
    document = ARCHITECTURE.read_text()
    stale = document.replace("| kuberay-operator | 1.7.0 |", "| kuberay-operator | 1.6.0 |")
    assert stale != document
    assert catalogues.rewritten(ARCHITECTURE, stale) == document


def example_keys(text: str) -> dict[str, list[str]]:
    """The keys of a JSON example written with `...` for values, by the path of the object holding them."""
    keys: dict[str, list[str]] = {}
    path: list[str | None] = []
    last: str | None = ""
    for match in re.finditer(r'"(\w+)":|[{}\[\]]|"(?:[^"\\]|\\.)*"', text):
        token, key = match.group(0), match.group(1)
        if token in ("{", "["):
            path.append(last if token == "{" else None)
        elif token in ("}", "]"):
            path.pop()
        elif key:
            last = key
            if None not in path:
                keys.setdefault(".".join(p for p in path if p), []).append(key)
    return keys


def test_the_readme_shows_every_key_of_the_training_output():
    """The example of `pulumi stack output training` names each key the program exports, at its top
    and in `gate`: the TrainingRun's outputs as `RunOutputs` declares them, and the program's own."""
    block = (
        (ROOT / "README.md").read_text().split("pulumi stack output training --json\n", 1)[1].split("```")[0]
    )
    shown = example_keys("\n".join(line.removeprefix("#").strip() for line in block.splitlines()))
    exported = run_program(dev_config()).outputs["training"]
    assert sorted(shown[""]) == sorted(exported)
    assert sorted(shown["gate"]) == sorted(exported["gate"])
    declared = training_output_keys()
    assert set(exported) - set(declared[TOP]) - {GATE} == {
        "predictedTokensPerS",
        "planVsMeasured",
        "dashboard",
        "cost",
    }
    assert set(exported["gate"]) == set(declared[GATE])


def test_the_benchmark_example_shows_every_key_of_the_benchmark_output():
    page = ROOT / "docs" / "operations" / "transport-verdict.md"
    block = page.read_text().split("pulumi stack output benchmark --json\n", 1)[1].split("```")[0]
    shown = example_keys("\n".join(line.removeprefix("#").strip() for line in block.splitlines()))
    assert shown[""] == list(benchmark_output_keys())


def test_the_readme_check_sees_a_key_the_example_lacks():
    keys = example_keys(
        '{"jobId": "...", "gate": {"seconds": ..., "evidence": ["a {b}", ...]}, "cost": {"usd": 1}}'
    )
    assert keys == {"": ["jobId", "gate", "cost"], "gate": ["seconds", "evidence"], "cost": ["usd"]}


def test_the_training_run_module_map_names_each_module():
    """The module map in `workloads/training_run/__init__.py` lists every module of the package, and
    no other."""
    package = ROOT / "workloads" / "training_run"
    bullets = (training_run.__doc__ or "").split("\n- ", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z0-9_]+(?:\.[a-z0-9_]+)?)`", bullets))
    modules = {
        ".".join(path.relative_to(package).with_suffix("").parts)
        for path in package.rglob("*.py")
        if path.name != "__init__.py"
    }
    assert named == modules
