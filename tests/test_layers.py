"""Who may import whom: the program's packages, the layers inside each, folder sizes, tests' places.

Each product package is a stack of layers, lowest first. A module may import its own unit (the
module or subpackage a layer names) and the layers below it, never a peer of its own layer or
anything above: an arrow back up fails here. The layers are declared in `tools/layers.py`, from which
docs/architecture.md's table is generated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness.import_graph import (
    PROGRAM_PACKAGES,
    crossings,
    imported_modules,
    imports_of,
    module_file,
    module_name,
    within,
)
from tests.harness.paths import REPO_ROOT as ROOT
from tools.layers import LAYERS, OUTSIDE

PRODUCT_FOLDERS = ("training", "infra", "workloads", "policy", "bench", "examples")
MODULES_PER_FOLDER = 12


def unit_of(name: str, layers: list[set[str]]) -> tuple[int, str] | None:
    """The layer and unit of a module: the longest unit that names it or a package above it.
    A package's own __init__ is the unit `<package>.__init__`."""
    best: tuple[int, str] | None = None
    for rank, units in enumerate(layers):
        for unit in units:
            if within(name, {unit}) and (best is None or len(unit) > len(best[1])):
                best = (rank, unit)
    return best


def arrows_back_up(package: str, graph: dict[str, set[str]]) -> list[str]:
    """Every import of `graph` (module name → imported modules) that the layers of `package` forbid."""
    layers, found = LAYERS[package], []
    for importer, names in sorted(graph.items()):
        placed = unit_of(importer, layers)
        if placed is None:
            found.append(f"{importer} is in no layer of {package}")
            continue
        rank, unit = placed
        for name in sorted(names):
            if name.split(".")[0] != package:
                if not within(name, set(OUTSIDE[package])):
                    found.append(f"{importer} imports {name}, outside what {package} may import")
                continue
            target = unit_of(f"{name}.__init__" if (ROOT / Path(*name.split("."))).is_dir() else name, layers)
            if target is None:
                found.append(f"{importer} imports {name}, which is in no layer")
            elif target[1] != unit and target[0] >= rank:
                found.append(f"{importer} (layer {rank}) imports {name} (layer {target[0]}, {target[1]})")
    return found


def module_graph(package: str) -> dict[str, set[str]]:
    """`imports_of` by module name (a package's own file is `<package>.__init__`)."""
    return {module_name(ROOT / path): names for path, names in imports_of(package).items()}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_imports_only_its_own_unit_and_the_layers_below(package):
    assert arrows_back_up(package, module_graph(package)) == []


def test_the_layer_check_sees_an_arrow_back_up():
    """The check itself: a data module that imported the loop, or a peer, or a new unplaced module."""
    graph = {
        "training.data.packing": {"training.loop", "training.metrics.report", "training.data.tokenizer"},
        "training.model.attention": {"training.errors", "training.config.run_config"},
        "training.unplaced": set(),
        "training.config.settings": {"platform_contract"},
    }
    assert arrows_back_up("training", graph) == [
        "training.config.settings imports platform_contract, outside what training may import",
        "training.data.packing (layer 1) imports training.loop (layer 6, training.loop)",
        "training.data.packing (layer 1) imports training.metrics.report (layer 1, training.metrics)",
        "training.unplaced is in no layer of training",
    ]
    workloads = {
        "workloads.training_run.access.jobs": {"workloads.training_run.verdicts.gate", "infra.config"}
    }
    assert arrows_back_up("workloads", workloads) == [
        "workloads.training_run.access.jobs (layer 3) imports workloads.training_run.verdicts.gate "
        "(layer 4, workloads.training_run.verdicts)"
    ]


def test_the_graph_check_sees_a_crossing():
    """Workloads may use infra (sizes, settings): the check must see those imports, at any depth."""
    found = crossings("workloads", {"infra"})
    assert "workloads/manifests/raycluster.py imports infra.aws_rules.sizing" in found
    assert "workloads/training_run/provider.py imports infra.config.aws_identity" in found


def test_infra_does_not_import_the_workloads():
    """The AWS side knows nothing of what runs on the cluster; the names both sides share come from the contract
    (platform_contract).

    It may read the training job's settings contract (`training.config`), its FLOP arithmetic
    (`training.metrics.flops`, the preview's run-time bound) and its CloudWatch metric names
    (`training.metrics.cloudwatch_metrics`, the dashboard's), all standard library only, never the
    training code itself; so are the `training` modules they import and the packages' own
    `__init__` files that importing them runs, followed to any depth.
    """
    allowed = frozenset(OUTSIDE["infra"]) - {"platform_contract"}
    assert crossings("infra", {"workloads", "training"}, allowed=allowed) == []
    standard = {*sys.stdlib_module_names, "__future__", "training"}
    reached = {name for names in imports_of("infra").values() for name in names if within(name, allowed)}
    pending, seen = sorted(reached), set()
    while pending:
        module = pending.pop()
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # the packages above run their __init__ first
            name = ".".join(parts[:depth])
            path = module_file(name)
            if name in seen or path is None:
                continue
            seen.add(name)
            names = imported_modules(path)
            assert {imported.split(".")[0] for imported in names} <= standard, name
            pending += [imported for imported in names if imported.startswith("training")]
    assert {"training", "training.config", "training.config.settings", "training.config.presets"} <= seen


# What reads from outside the process: AWS's SDKs and Pulumi's (invokes, the engine), HTTP, sockets.
READERS = {"pulumi", "pulumi_aws", "pulumi_eks", "boto3", "botocore", "urllib.request", "http", "socket"}


def test_the_aws_rules_read_nothing():
    """`infra/aws_rules` judges what is read elsewhere (`infra/preflight/reads`, `infra/planner`,
    `infra/region_survey`), so it imports nothing that reads AWS, a registry or the engine."""
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "infra" / "aws_rules").glob("*.py"))
        for name in sorted(imported_modules(path))
        if within(name, READERS)
    ]
    assert found == []


def test_training_imports_nothing_of_the_program():
    """Only the `training` package is shipped to the Ray pods, so it cannot import the rest."""
    assert crossings("training", PROGRAM_PACKAGES - {"training"}) == []


def test_policy_pack_imports_nothing_of_the_program():
    """The pack runs in its own virtualenv from policy/; it keeps copies (checked in tests/policy)."""
    assert crossings("policy", PROGRAM_PACKAGES - {"policy"}) == []


@pytest.mark.parametrize("package", PRODUCT_FOLDERS)
def test_no_product_package_imports_the_development_tools(package):
    """tools/ (the generators, the layer declarations) is for development; nothing shipped needs it."""
    assert crossings(package, {"tools"}) == []


def product_folders() -> list[Path]:
    return [
        folder
        for top in PRODUCT_FOLDERS
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]
        if folder.is_dir() and "__pycache__" not in folder.parts and any(folder.glob("*.py"))
    ]


def test_no_product_folder_holds_more_than_a_dozen_modules():
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in product_folders()
        if (count := len([path for path in folder.glob("*.py") if path.name != "__init__.py"]))
        > MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_every_product_package_has_its_tests_under_the_same_path():
    untested = [
        str(folder.relative_to(ROOT))
        for folder in product_folders()
        if not any((ROOT / "tests" / folder.relative_to(ROOT)).glob("test_*.py"))
    ]
    assert untested == []


# Product modules without a test file of their own (tests/<same path>/test_<module>.py), each with
# why: where its behaviour is tested instead, or why it has none to test.
UNTESTED_MODULES: dict[str, str] = {
    "training/__main__.py": "`python -m training`, run by tests/training/test_main_job.py",
}


def product_modules() -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for top in PRODUCT_FOLDERS
        for path in (ROOT / top).rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    )


def own_test_file(module: str) -> Path:
    path = Path(module)
    return ROOT / "tests" / path.parent / f"test_{path.name}"


def test_every_product_module_has_a_test_file_under_the_same_path_or_says_why_not():
    """A module's tests are tests/<its folder>/test_<its name>.py; a module without one is listed in
    UNTESTED_MODULES with where it is tested instead, and an entry that has a test file, or names no
    module, is stale."""
    modules = product_modules()
    untested = [module for module in modules if not own_test_file(module).exists()]
    assert sorted(set(untested) - UNTESTED_MODULES.keys()) == []
    assert sorted(UNTESTED_MODULES.keys() - set(untested)) == []
    assert all(reason.strip() for reason in UNTESTED_MODULES.values())


def test_tests_share_helpers_through_the_harness_only():
    """A test file imports no other test file: what two need lives in tests/harness."""
    found = [
        f"{path} imports {name}"
        for path, names in imports_of("tests").items()
        for name in names
        if name.startswith("tests.") and not within(name, {"tests.harness"})
    ]
    assert found == []
