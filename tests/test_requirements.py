"""Every install resolves against one set of pins: each requirements file loads constraints.txt,
and constraints.txt pins every package they name to a version they accept (else: run .ci/lock)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.harness.paths import REPO_ROOT

ROOT = REPO_ROOT
CONSTRAINTS = ROOT / "constraints.txt"
REQUIREMENT_FILES = [
    ROOT / "requirements.txt",
    ROOT / "requirements-train.txt",
    ROOT / "requirements-dev.txt",
    ROOT / "policy" / "requirements.txt",
]


def lines(path: Path) -> list[str]:
    return [
        line.split(" #")[0].strip()
        for line in path.read_text().splitlines()
        if line.strip()[:1] not in ("", "#")
    ]


def pins() -> dict[str, list[Requirement]]:
    """Pinned versions by package; a package may carry one pin per environment marker."""
    pinned: dict[str, list[Requirement]] = {}
    for line in lines(CONSTRAINTS):
        requirement = Requirement(line)
        pinned.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return pinned


@pytest.mark.parametrize("path", REQUIREMENT_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_each_requirements_file_installs_against_the_constraints(path):
    options = [line.split(maxsplit=1) for line in lines(path) if line.startswith("-c")]
    assert [(path.parent / target).resolve() for _, target in options] == [CONSTRAINTS]


@pytest.mark.parametrize("path", REQUIREMENT_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_constraints_pin_every_requirement_to_an_accepted_version(path):
    stale = []
    pinned = pins()
    for line in lines(path):
        if line.startswith("-"):
            continue
        requirement = Requirement(line)
        candidates = pinned.get(canonicalize_name(requirement.name), [])
        versions = [next(iter(pin.specifier)).version for pin in candidates]
        if not versions or not all(requirement.specifier.contains(version) for version in versions):
            stale.append(f"{line}: constraints.txt has {versions or 'no pin'}")
    assert stale == [], "run .ci/lock"


def test_every_pin_is_exact():
    loose = [
        str(pin) for group in pins().values() for pin in group if not str(pin.specifier).startswith("==")
    ]
    assert loose == []
