"""The program's import graph read from its sources with `ast`: who imports which module."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.harness.paths import REPO_ROOT as ROOT

PROGRAM_PACKAGES = {
    "platform_contract",
    "tools",
    "infra",
    "workloads",
    "training",
    "policy",
    "bench",
    "examples",
    "tests",
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def module_file(name: str) -> Path | None:
    """The file that defines module `name` (a module file or a package's __init__), if any."""
    base = ROOT / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module a file imports, at any depth (functions, TYPE_CHECKING too):
    `from P import x` counts as importing P.x where that is a module, else as importing P; a relative
    import is named from the file's place in the tree."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative (the policy pack's, which imports as `rules` and `policy.rules`)
                package = module_name(path).split(".")[: -node.level]
                module = ".".join([*package, *filter(None, [module])])
            for alias in node.names:
                whole = f"{module}.{alias.name}"
                names.add(whole if module_file(whole) else module)
    return names


def imports_of(package: str) -> dict[str, set[str]]:
    """First-party modules imported by each file of `package` (a folder, or a module file)."""
    files = sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else [ROOT / f"{package}.py"]
    assert files, package
    return {
        str(path.relative_to(ROOT)): {
            name for name in imported_modules(path) if name.split(".")[0] in PROGRAM_PACKAGES
        }
        for path in files
    }


def crossings(package: str, forbidden: set[str], allowed: frozenset[str] = frozenset()) -> list[str]:
    found = []
    for path, names in imports_of(package).items():
        for name in sorted(names):
            if name.split(".")[0] in forbidden and not within(name, allowed):
                found.append(f"{path} imports {name}")
    return found


def within(name: str, prefixes: set[str] | frozenset[str]) -> bool:
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)
