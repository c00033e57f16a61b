"""Sizes the product keeps: a function or method reads as one screen or two, a module as one idea.

The product is every Python file of the repository outside `tests/` (bench and tools included).
No function or method is over `FUNCTION_LINES`, from its `def` to its last line, but a Pulumi
`ComponentResource` subclass's `__init__`, which declares the component's child resources one after
another; `TIGHTER_CAPS` holds a few to less. No module is over `MODULE_LINES`. What is over its cap
is listed with why, and an entry that no longer is over is stale.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

from tests.harness.paths import REPO_ROOT as ROOT

FUNCTION_LINES = 100
MODULE_LINES = 500
# Functions held to less than FUNCTION_LINES (`path:qualified name` -> lines), and why.
TIGHTER_CAPS: dict[str, int] = {
    # The loop's run reads as the order of its phases; each phase is a function of its own.
    "training/loop.py:train": 80,
}
# Functions over their cap, each with why.
LONG_FUNCTIONS: dict[str, str] = {}
# Modules over MODULE_LINES, each with why.
LONG_MODULES: dict[str, str] = {
    "policy/rules/storage.py": "the pack's storage rules, which register themselves by import from one "
    "module per area (policy/rules/registry.py)",
    "training/components/watchdog.py": "one thread's state machine (arm, judge, name, end) with the "
    "heartbeat it reads; its judgements are pure functions beside the thread that acts on them",
    "workloads/training_run/runner.py": "one run's steps in their order (deadline, readiness, gate, job, "
    "verdicts, release); following the jobs (`job_following`) and the verdicts are modules of their own",
}
SKIPPED_FOLDERS = {"tests", "node_modules", "__pycache__"}


def product_files() -> list[Path]:
    """Every product Python file, relative to the repository: hidden folders (.venv, .git) skipped."""
    found = []
    for folder, folders, files in os.walk(ROOT):
        folders[:] = [name for name in folders if name not in SKIPPED_FOLDERS and not name.startswith(".")]
        found += [Path(folder, name).relative_to(ROOT) for name in files if name.endswith(".py")]
    return sorted(found)


def is_component_resource(node: ast.ClassDef) -> bool:
    """A class whose bases name `ComponentResource` (`pulumi.ComponentResource` or imported bare)."""
    return any(
        (isinstance(base, ast.Name) and base.id == "ComponentResource")
        or (isinstance(base, ast.Attribute) and base.attr == "ComponentResource")
        for base in node.bases
    )


def function_lengths(source: str) -> dict[str, int]:
    """Lines of each function and method of `source`, by qualified name (`Class.method`,
    `outer.inner`), from its `def` line to its last; a `ComponentResource`'s `__init__` left out."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, component: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                if not (component and child.name == "__init__"):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", is_component_resource(child))
            else:
                visit(child, prefix, component)

    visit(ast.parse(source), "", False)
    return lengths


def module_lines(source: str) -> int:
    return len(source.splitlines())


@functools.cache
def product_sizes() -> tuple[dict[str, int], dict[str, int]]:
    """The product's functions (`path:qualified name`) and modules (`path`), each with its lines."""
    functions, modules = {}, {}
    for path in product_files():
        source = (ROOT / path).read_text(encoding="utf-8")
        modules[path.as_posix()] = module_lines(source)
        functions.update(
            {f"{path.as_posix()}:{name}": lines for name, lines in function_lengths(source).items()}
        )
    return functions, modules


def over_caps() -> dict[str, int]:
    functions, _ = product_sizes()
    return {
        name: lines for name, lines in functions.items() if lines > TIGHTER_CAPS.get(name, FUNCTION_LINES)
    }


def test_no_function_or_method_is_over_100_lines():
    over = over_caps()
    assert {name: lines for name, lines in over.items() if name not in LONG_FUNCTIONS} == {}
    assert sorted(LONG_FUNCTIONS.keys() - over.keys()) == [], "stale: within its cap now"
    assert all(reason.strip() for reason in LONG_FUNCTIONS.values())


def test_the_training_loop_s_train_is_at_most_80_lines():
    functions, _ = product_sizes()
    assert TIGHTER_CAPS["training/loop.py:train"] == 80
    assert functions["training/loop.py:train"] <= 80 or "training/loop.py:train" in LONG_FUNCTIONS


def test_no_module_is_over_500_lines():
    _, modules = product_sizes()
    over = {path: lines for path, lines in modules.items() if lines > MODULE_LINES}
    assert {path: lines for path, lines in over.items() if path not in LONG_MODULES} == {}
    assert sorted(LONG_MODULES.keys() - over.keys()) == [], "stale: within the cap now"
    assert all(reason.strip() for reason in LONG_MODULES.values())


def test_the_product_is_every_python_file_outside_the_tests():
    files = {path.as_posix() for path in product_files()}
    assert {
        "__main__.py",
        "platform_contract.py",
        "bench/train_bench/__main__.py",
        "tools/layers.py",
    } <= files
    assert not any(path.startswith(("tests/", ".")) or "/." in path for path in files)


def test_the_measure_sees_a_long_function_and_leaves_out_a_component_s_init():
    """The check itself, on planted sources: a 101-line function, a method and a nested function
    measured from `def` to last line, a `ComponentResource`'s `__init__` left out, another's kept."""
    body = "".join(f"    x{line} = {line}\n" for line in range(100))
    source = (
        "import pulumi\n"
        f"@decorated\ndef long():\n{body}"
        "class Store(pulumi.ComponentResource):\n"
        f"    def __init__(self):\n{body.replace('    ', '        ')}"
        "    def method(self):\n        def inner():\n            pass\n        return inner\n"
        "class Plain(Base):\n    def __init__(self):\n        pass\n"
    )
    assert function_lengths(source) == {
        "long": 101,
        "Store.method": 4,
        "Store.method.inner": 2,
        "Plain.__init__": 2,
    }
    assert {name for name, lines in function_lengths(source).items() if lines > FUNCTION_LINES} == {"long"}
    assert module_lines("x = 1\n" * (MODULE_LINES + 1)) == MODULE_LINES + 1
