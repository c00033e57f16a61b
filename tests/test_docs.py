"""The documentation stays true to the code: links resolve, tables match what the program does."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pulumi
import pytest
import yaml

from infra.config.parsing import key_names
from infra.config.stack import StackKeys
from infra.config.training_settings import setting_keys
from tests.harness.doc_tables import table
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


# A page a reader takes in at one sitting: at most about 13,000 characters (today's longest pages
# that keep to it are about 12,300), and no table cell over 300 (a long cell is prose forced into a
# table; the line cap alone let one cell reach 2,500). Exemptions, each with its reason; an exempt
# page's cells still stop at 600:
PAGE_MAX_CHARS = 13_000
CELL_MAX_CHARS = 300
EXEMPT_CELL_MAX_CHARS = 600
LONG_PAGES = {
    # generated tables: their prose is the key declaration's (infra/config/stack.py), split with it
    "configuration.md": "its tables are generated from the key declaration",
    # generated tables (layers, pins, rules) and the layout; a split moves the generators' targets
    "architecture.md": "its tables are generated from layers.py and the catalogues",
    # the dated record's index: one row a report
    "benchmarks.md": "the record's index grows a row a report",
    # every open door in one list, so none is missed; a split by layer (AWS, Kubernetes, Ray) is its own job
    "operations/security.md": "one list of what stays open",
}
LONG_CELLS = {
    "configuration.md": "generated from the key declaration's prose",
    "architecture.md": "the layers table is generated from layers.py",
}


def long_cells(document: Path, limit: int = CELL_MAX_CHARS) -> list[str]:
    """The table cells of the page over `limit` characters, by line number."""
    return [
        f"{number}: {cell.strip()[:60]}..."
        for number, line in enumerate(document.read_text().splitlines(), start=1)
        if line.startswith("|")
        for cell in line.split("|")[1:-1]
        if len(cell.strip()) > limit
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=page_id)
def test_a_page_is_short_enough_to_read_at_one_sitting(document):
    if page_id(document) not in LONG_PAGES:
        assert len(document.read_text()) <= PAGE_MAX_CHARS


@pytest.mark.parametrize("document", DOCUMENTS, ids=page_id)
def test_table_cells_stay_short(document):
    if page_id(document) not in LONG_CELLS:
        assert long_cells(document) == []
    assert long_cells(document, limit=EXEMPT_CELL_MAX_CHARS) == []


def test_the_exemptions_from_the_size_caps_are_still_needed():
    """An exempt page that meets the caps leaves the list."""
    pages = {page_id(document): document for document in DOCUMENTS}
    assert [page for page in LONG_PAGES if len(pages[page].read_text()) <= PAGE_MAX_CHARS] == []
    assert [page for page in LONG_CELLS if not long_cells(pages[page])] == []


def test_the_cell_check_catches_a_long_cell(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"| a | b |\n| --- | --- |\n| short | {'x' * 301} |\n")
    assert long_cells(page) == [f"3: {'x' * 60}..."]


def test_the_history_check_catches_narration_and_spares_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "The probe no longer runs after the job.\n9.87 GiB before, 4.18 GiB now.\n"
        "It stops before the job is submitted.\n`--known-now` and\n```\nnow = clock()\n```\n"
    )
    assert [number for number, line in prose(page) if HISTORY.search(line)] == [1, 2]


def test_readme_stays_short():
    """A front door of at most 12 KB: detail lives on the docs pages it links to."""
    assert (ROOT / "README.md").stat().st_size <= README_MAX_BYTES


# The keys a first deploy touches, which the README names with their defaults.
FIRST_DEPLOY_KEYS = "The keys a first deploy touches"


def test_readme_names_the_keys_a_first_deploy_touches():
    """Its table of first-deploy keys, `gpuNodeCount` among them, gives each key's default as the
    generated key table does (the README may add where the default is set)."""
    readme = ROOT / "README.md"
    opening = next(line for line in readme.read_text().splitlines() if line.startswith(FIRST_DEPLOY_KEYS))
    rows = table(readme, opening)
    defaults = {code(row[0]): row[1] for row in table(CONFIGURATION, "## Stack keys")}
    shown = {code(row[0]): row[1] for row in rows}
    assert "gpuNodeCount" in shown
    assert [key for key, default in shown.items() if not default.startswith(defaults.get(key) or "?")] == []


# The pages whose repository paths must exist: the README, docs/ and the policy pack's README.
CITING = [*DOCUMENTS, ROOT / "policy" / "README.md"]
# A repository path: `dir/.../name.ext`, in prose, code spans and ```text blocks alike.
REPOSITORY_PATH = re.compile(
    r"(?<![\w./:@~$-])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]*[A-Za-z0-9_]\.[A-Za-z0-9]+)\b"
)


def missing_paths(document: Path, root: Path = ROOT) -> list[str]:
    """Paths `dir/.../name.ext` the page names that are neither under the repository's root nor
    beside the page. Only paths starting at a top-level folder of the repository count: an
    upstream project's file (`ray/_private/node.py`) or a path on a pod is not the repository's."""
    top = {path.name for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")}
    return [
        path
        for path in REPOSITORY_PATH.findall(document.read_text())
        if path.split("/")[0] in top and not (root / path).exists() and not (document.parent / path).exists()
    ]


def layout_paths(document: Path) -> list[str]:
    """The files and folders the layout tree (the ```text block under `## Layout`) names, as
    repository paths: a line's indent (two spaces a level) places its `folder/` or `name.py` in the
    folder above it; a bare `name.py` or `folder/` in a line's description is in that line's folder,
    a `dir/name.py` there is under that folder or the line's parent."""
    block = document.read_text().split("\n## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    stack: list[str] = []
    named: list[str] = []
    for line in block.splitlines():
        if line.startswith(" " * 20):  # a description's continuation: in the last line's folder
            where, description = "/".join(stack), line
        else:
            indent = (len(line) - len(line.lstrip())) // 2
            del stack[indent:]
            entry, _, description = line.strip().partition("  ")
            names = [name.strip() for name in entry.split(",")]
            parent = "/".join(stack)
            named += [f"{parent}/{name}".lstrip("/") for name in names]
            folders = [name.rstrip("/") for name in names if name.endswith("/")]
            if len(folders) == 1 and len(names) == 1:
                stack.append(folders[0])
            where = "/".join(stack)
        prose_only = re.sub(r"`[^`]*`", "", description)
        for token in re.findall(r"(?<![\w/.])([\w/]+\.(?:py|md|svg|yaml)|\w+/)(?![\w/])", prose_only):
            parent = where.rsplit("/", 1)[0] if "/" in where else ""
            candidates = [f"{where}/{token}".lstrip("/"), f"{parent}/{token}".lstrip("/"), token]
            named.append(next((c for c in candidates if (ROOT / c).exists()), candidates[0]))
    return named


@pytest.mark.parametrize("document", CITING, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_document_cites_a_file_the_repository_lacks(document):
    """Every repository path a page names exists, and no page cites a design brief that is not in the
    repository (users have only what it holds)."""
    assert not re.search(r"\bSPEC\b|the spec's", document.read_text())
    assert missing_paths(document) == []


def test_the_layout_tree_names_only_files_that_exist():
    """docs/architecture.md's tree of packages: each folder and module it names is in the repository."""
    assert [path for path in layout_paths(ARCHITECTURE) if not (ROOT / path).exists()] == []


def test_the_path_check_catches_a_renamed_file(tmp_path):
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "here.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text(
        "`infra/here.py` and infra/gone.py\n```text\ninfra/moved.py\n```\n"
        "upstream ray/_private/node.py, a pod's /var/log/x.log\n"
    )
    assert missing_paths(page, root=tmp_path) == ["infra/gone.py", "infra/moved.py"]


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
ACCOUNTS: dict[str, dict] = {
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
        "forecastVsMeasured",
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


TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
CHECK_ORDER = ["config", "preflight", "policy", "readiness", "gate", "job", "verdict"]
# Where the program's one-line refusals are written.
PRODUCT = [
    path for folder in ("infra", "workloads", "training", "policy") for path in (ROOT / folder).rglob("*.py")
]


def first_words_pattern(first_words: str) -> re.Pattern[str]:
    """The first words as written in the code: `...` stands for a placeholder the message fills in."""
    return re.compile(".{1,80}?".join(re.escape(part) for part in first_words.split("...")), flags=re.DOTALL)


def test_troubleshooting_opens_with_the_order_of_the_checks():
    section = TROUBLESHOOTING.read_text().split("\n## The order of the checks\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\d+\. \*\*(\w+)\*\*", section, flags=re.MULTILINE) == CHECK_ORDER


def test_troubleshooting_lists_the_refusals_in_the_order_of_the_checks():
    rows = table(TROUBLESHOOTING, "## The refusals, by first words")
    checks = [row[1] for row in rows]
    assert set(checks) <= set(CHECK_ORDER)
    assert checks == sorted(checks, key=CHECK_ORDER.index)
    assert all(code(row[0]) and row[2] and row[3] and "](" in row[4] for row in rows)


# Where a key of the page may start besides a string literal's start: after the opening shared by
# every refusal of the fabric gate, as the page says.
DOCUMENTED_PREFIXES = ["failed, so the training job was not submitted: "]


def string_literals(source: str) -> list[str]:
    """The module's string literals, implicitly joined parts as one, an f-string's fields as `{}`."""
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            texts.append(
                "".join(str(part.value) if isinstance(part, ast.Constant) else "{}" for part in node.values)
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    return texts


def opens_a_message(first_words: str, literals: list[str]) -> bool:
    """The key starts a string literal, or follows a documented prefix within one: words found only
    inside a message are not what a reader sees first."""
    pattern = first_words_pattern(first_words)
    after_prefix = [
        re.compile(re.escape(prefix) + pattern.pattern, re.DOTALL) for prefix in DOCUMENTED_PREFIXES
    ]
    return any(pattern.match(text) or any(p.search(text) for p in after_prefix) for text in literals)


def test_each_refusal_of_troubleshooting_is_still_in_the_code():
    """Each entry's first words open a message of the code that prints it (a reworded message moves
    its entry), and the page names the gate's shared opening that its gate rows follow."""
    literals = [text for path in PRODUCT for text in string_literals(path.read_text())]
    stale = [
        row[0]
        for row in table(TROUBLESHOOTING, "## The refusals, by first words")
        if not opens_a_message(code(row[0]) or "", literals)
    ]
    assert stale == []
    page = " ".join(TROUBLESHOOTING.read_text().split())
    assert all(f"`{prefix.strip()}`" in page for prefix in DOCUMENTED_PREFIXES)
    assert all(any(prefix in text for text in literals) for prefix in DOCUMENTED_PREFIXES)


def test_the_first_words_check_catches_words_from_the_middle_of_a_message():
    """A planted key taken from inside a message fails; one after the gate's opening passes."""
    source = (
        'what = "NCCL\'s log says EFA, but the EFA counters of the worker nodes did not move"\n'
        'error = f"the fabric gate (probe job {job}) failed, so the training job was not submitted: "\n'
        'inline = f"the fabric gate ({job}) failed, so the training job was not submitted: the link is slow"\n'
    )
    literals = string_literals(source)
    assert opens_a_message("NCCL's log says EFA, but the EFA counters", literals)
    assert opens_a_message("the fabric gate (probe job ...) failed", literals)
    assert opens_a_message("the link is slow", literals)
    assert not opens_a_message("the EFA counters of the worker nodes did not move", literals)
    assert not opens_a_message("so the training job was not submitted", literals)


def test_the_first_words_check_catches_a_reworded_message():
    source = 'raise Error(f"GPU node group {group.name} is still {group.status} after")'
    assert first_words_pattern("GPU node group ... is still").search(source)
    assert not first_words_pattern("GPU node group ... stays").search(source)
