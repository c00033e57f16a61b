"""docs/glossary.md: each term defined once, where it lives, and the word fence.

The fence holds the words most easily misused to the files where they may appear: a new
`StrategyPlan`, a `class Verdict` in training/ or "facts" for a constant fails here, not in a
review. A fence matches either the raw text of a line or its words, where `StrategyPlan`,
`plan_rows` and `planVsMeasured` are the words "strategy plan", "plan rows", "plan vs measured".
`kept` spans are cut from a line first: names kept on purpose, each with its reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.harness.doc_tables import table
from tests.harness.paths import REPO_ROOT as ROOT

GLOSSARY = ROOT / "docs" / "glossary.md"
# The shared vocabulary: each term has one meaning, written once in docs/glossary.md.
TERMS = [
    "facts",
    "figures",
    "measurements",
    "contract",
    "plan",
    "the planner",
    "forecast",
    "choice",
    "preflight",
    "policy",
    "readiness",
    "probe",
    "gate",
    "evidence",
    "verdict",
    "reader",
    "job",
    "run",
    "variant",
    "session",
    "attempt",
    "fault",
    "restart",
    "drain",
    "notice",
    "deadline",
    "config",
    "settings",
    "checkpoint settings",
    "report",
]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_glossary_defines_each_term_of_the_vocabulary():
    rows = table(GLOSSARY, "## Terms")
    assert [row[0] for row in rows] == TERMS
    assert all(row[1] and code_spans(row[2]) for row in rows)


def test_the_glossary_names_only_files_and_names_that_exist():
    """Each `path` of the glossary's last column exists, and each `path:name` is defined in that file."""
    missing = []
    for row in table(GLOSSARY, "## Terms"):
        for span in code_spans(row[2]):
            path, _, name = span.partition(":")
            file = ROOT / path
            if not file.exists() or (
                name
                and not re.search(rf"^\s*(def|class) {re.escape(name)}\b", file.read_text(), re.MULTILINE)
            ):
                missing.append(span)
    assert missing == []


@dataclass(frozen=True)
class Fence:
    """`pattern` may match only in files under `allowed` (a folder ends in /, else a file)."""

    term: str
    pattern: re.Pattern[str]
    allowed: tuple[str, ...]
    on_words: bool = True
    kept: re.Pattern[str] | None = None


# Module paths name packages, not ideas: `workloads.training_run.verdicts` is where verdicts live.
VERDICTS_PACKAGE = re.compile(r"workloads[./]training_run[./]verdicts\b")
FENCES = [
    Fence(
        "plan: Pulumi's only",
        re.compile(r"\bplan(s|ned|ning)?\b"),
        (
            # run_program's result is the plan Pulumi recorded under mocks
            "tests/",
            # pages on what `pulumi preview` plans
            "README.md",
            "UPGRADING.md",
            "docs/glossary.md",
            "docs/operations/capacity-reservations.md",
            "docs/operations/changing-a-live-stack.md",
            "docs/operations/preview-checks.md",
            "docs/operations/tearing-down.md",
            "docs/test-fakes.md",
            "docs/testing.md",
            "infra/aws_rules/live_stack.py",
            "infra/preflight/live_cluster.py",
            # other libraries' plans: DCP's load plan, torch's redistribute plans, Ray Data's
            "training/components/storage.py",
            "training/distributed/rank_exit.py",
            "training/launch/ray_quiet.py",
        ),
        # The TrainingRun's recorded input keeps its name (a renamed input changes every recorded
        # run); `planVsMeasured` has a fence of its own; AWS Savings Plans are AWS's.
        kept=re.compile(
            r"`planned`|\bplanned=|\.planned\b|\"planned\"|\bplanned:|planVsMeasured|Savings Plans"
        ),
    ),
    Fence(
        "the planner's former names",
        re.compile(
            r"StrategyPlan|PlannedRun|\blog_plan\b|\bplan_(rows|table)\b|measured_against_plan|\binfra[./]plan\b"
        ),
        ("UPGRADING.md", "tests/test_glossary.py"),
        on_words=False,
    ),
    Fence(
        "planVsMeasured: exported beside forecastVsMeasured for one release",
        re.compile(r"planVsMeasured"),
        (
            "__main__.py",
            "README.md",
            "UPGRADING.md",
            "docs/glossary.md",
            "docs/operations/preview-checks.md",
            "tests/infra/test_pricing.py",
            "tests/test_docs.py",
            "tests/test_glossary.py",
        ),
        on_words=False,
    ),
    Fence(
        "verdict: a job's fabric judged from its evidence",
        re.compile(r"\bverdicts?\b"),
        (
            "workloads/",
            "docs/",
            "README.md",
            "UPGRADING.md",
            "tests/",
            "__main__.py",
            "platform_contract.py",
            "training/fabric_probe.py",
            "infra/config/stack.py",
            "infra/planner/cost.py",
            "infra/resources/observability.py",
            # the survey's output key, which scripts read (ZONE_STANDINGS)
            "infra/region_survey.py",
        ),
        kept=VERDICTS_PACKAGE,
    ),
    Fence(
        "a verdict's class: the transport's only",
        re.compile(r"class \w*Verdict\b"),
        ("workloads/nccl_transport.py", "tests/test_glossary.py"),
        on_words=False,
    ),
    Fence(
        "facts: live reads",
        re.compile(r"\bfacts?\b"),
        (
            "infra/aws_rules/",
            "infra/preflight/",
            "infra/resources/node_groups.py",
            "infra/region_survey.py",
            "infra/planner/cost.py",
            "infra/planner/refresh.py",
            "workloads/",
            "training/metrics/efa_meter.py",
            "__main__.py",
            "docs/architecture.md",
            "docs/configuration.md",
            "docs/glossary.md",
            "tests/harness/",
            "tests/infra/",
            "tests/workloads/",
            "tests/test_glossary.py",
        ),
    ),
    Fence(
        "figures: declared numbers",
        re.compile(r"\bfigures?\b"),
        (
            "infra/planner/",
            "infra/pricing.py",
            "infra/aws_rules/",
            # declared margins the job and the preview share
            "training/config/",
            # matplotlib's figure
            "training/metrics/artifacts.py",
            "docs/",
            "README.md",
            "bench/",
            "tests/",
        ),
        # The module that declares them names them.
        kept=re.compile(r"infra[./]planner[./]figures\b|test_figures\b"),
    ),
    Fence(
        "figures are never measured or live",
        re.compile(r"\bmeasured figures?\b|\bfigures? as AWS states\b"),
        ("tests/test_glossary.py",),
        on_words=False,
    ),
]
SCANNED_SUFFIXES = {".py", ".md", ".yaml", ".toml", ".txt"}
# History, dated records, captured logs and vendored files keep the words they were written with.
NOT_SCANNED = ("CHANGELOG.md", "bench/reports/", "tests/fixtures/", "workloads/crds/")


def words(line: str) -> str:
    """A line's words: identifiers split at `_` and at each capital, lower case."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|_", " ", line).lower()


def allowed(path: str, places: Iterable[str]) -> bool:
    return any(path.startswith(place) if place.endswith("/") else path == place for place in places)


def trespasses(files: Iterable[tuple[str, str]], fences: Iterable[Fence]) -> list[str]:
    """`path:line: term` for each line of `files` ((path, text) pairs) a fence keeps its word out of."""
    found = []
    fences = list(fences)
    for path, text in files:
        watching = [fence for fence in fences if not allowed(path, fence.allowed)]
        for number, line in enumerate(text.splitlines(), 1):
            for fence in watching:
                cut = fence.kept.sub(" ", line) if fence.kept else line
                if fence.pattern.search(words(cut) if fence.on_words else cut):
                    found.append(f"{path}:{number}: {fence.term}")
    return found


def repository_files(root: Path) -> list[tuple[str, str]]:
    """(path, text) of each scanned file under `root`, hidden folders and caches left out."""
    relative = []
    for folder, folders, names in os.walk(root):
        folders[:] = sorted(name for name in folders if not name.startswith(".") and name != "__pycache__")
        base = Path(folder).relative_to(root)
        relative += [(base / name).as_posix() for name in names if Path(name).suffix in SCANNED_SUFFIXES]
    return [(path, (root / path).read_text()) for path in sorted(relative) if not allowed(path, NOT_SCANNED)]


def test_each_fenced_word_appears_only_where_its_fence_allows():
    assert trespasses(repository_files(ROOT), FENCES) == []


def test_the_fence_catches_a_word_planted_outside_it(tmp_path):
    planted = {
        "infra/planner/planner.py": "class StrategyPlan:\n    '''The plan of a strategy.'''\n",
        "training/components/hangs.py": "@dataclass\nclass Verdict:\n    hung: bool\n",
        "policy/rules/keys.py": "verdicts = [check(key) for key in keys]\n",
        "platform_contract.py": "# The shared facts.\n",
        "training/loop.py": "# The live figures as AWS states them now.\n",
        "infra/resources/observability.py": 'export("planVsMeasured", value)\n',
        "docs/training/running.md": "Run `python -m infra.plan --stack dev`.\n",
    }
    for path, text in planted.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert trespasses(repository_files(tmp_path), FENCES) == [
        "docs/training/running.md:1: plan: Pulumi's only",
        "docs/training/running.md:1: the planner's former names",
        "infra/planner/planner.py:1: plan: Pulumi's only",
        "infra/planner/planner.py:1: the planner's former names",
        "infra/planner/planner.py:2: plan: Pulumi's only",
        "infra/resources/observability.py:1: planVsMeasured: exported beside forecastVsMeasured for one release",
        "platform_contract.py:1: facts: live reads",
        "policy/rules/keys.py:1: verdict: a job's fabric judged from its evidence",
        "training/components/hangs.py:2: verdict: a job's fabric judged from its evidence",
        "training/components/hangs.py:2: a verdict's class: the transport's only",
        "training/loop.py:1: figures: declared numbers",
        "training/loop.py:1: figures are never measured or live",
    ]


def test_the_fence_lets_the_kept_names_and_pulumis_plan_pass(tmp_path):
    """The recorded input `planned`, the transport's `Verdict`, the verdicts package and Pulumi's plan
    in the pages on the preview are where they belong."""
    kept = {
        "workloads/training_run/schema.py": "    planned: PredictedRun | None = _input(\n",
        "infra/planner/report.py": "    (`recorded`, the TrainingRun's `planned`)\n    recorded.planned\n",
        "infra/planner/cost.py": "no discount (Savings Plans, credits)\n",
        "workloads/nccl_transport.py": "class Verdict:\n",
        "training/metrics/cloudwatch_metrics.py": "# judged in `workloads.training_run.verdicts.fabric`\n",
        "docs/operations/preview-checks.md": "before any resource is planned: planned as new\n",
        "infra/aws_rules/sizing.py": '"""Instance facts from AWS."""\n',
    }
    assert trespasses(kept.items(), FENCES) == []
