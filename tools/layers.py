"""Who may import whom: each program package's layers, lowest first, and what it may import of the others.

A module imports its own unit (the module or subpackage a layer names) and the layers below it,
never a peer of its own layer or anything above. `tests/test_layers.py` enforces these
declarations; `python -m tools docs` writes them into docs/architecture.md. Standard library only.
"""

from __future__ import annotations

# Each package's layers, lowest first. Modules of `training` run in the Ray pods and import
# nothing else of the program; `infra` reads the job's settings contract, FLOP arithmetic and
# CloudWatch metric names (standard library only, checked by the test); `workloads` reads the job's
# log format, the EFA counters' sysfs names and the variable that names the cluster for its metrics.
LAYERS: dict[str, list[set[str]]] = {
    "training": [
        {"training.__init__", "training.errors", "training.config"},
        {"training.data", "training.metrics"},
        {"training.model", "training.session"},
        {"training.distributed"},
        {"training.components"},
        {"training.build", "training.step"},
        {"training.loop"},
        {"training.launch"},
        {"training.cli", "training.export", "training.fabric_probe"},
        {"training.__main__"},
    ],
    "infra": [
        {"infra.__init__", "infra.config"},
        {"infra.aws_rules"},
        {"infra.resources", "infra.planner"},
        {"infra.preflight", "infra.region_survey"},
        {"infra.pricing", "infra.aws_identity"},
    ],
    "workloads": [
        {
            "workloads.__init__",
            "workloads.efa_counter_reader",
            "workloads.nccl_logs",
            "workloads.nccl_names",
        },
        {"workloads.manifests", "workloads.nccl_transport"},
        {
            "workloads.addons",
            "workloads.nccl_transport_cli",
            "workloads.ray_cluster",
            "workloads.training_run.errors",
        },
        {"workloads.training_run.access", "workloads.training_run.engine_host"},
        {
            "workloads.training_run.verdicts",
            "workloads.training_run.attempts",
            "workloads.training_run.readiness",
            "workloads.training_run.schema",
        },
        {
            "workloads.training_run.deadline",
            "workloads.training_run.gpu_node_group",
            "workloads.training_run.job_following",
            "workloads.training_run.node_hours",
        },
        {"workloads.training_run.outputs", "workloads.training_run.runner"},
        {"workloads.training_run.provider"},
        {"workloads.training_run.__init__"},
    ],
    "tools": [
        {"tools.__init__", "tools.regions", "tools.layers"},
        {"tools.catalogues", "tools.config_tables"},
        {"tools.docs"},
        {"tools.__main__"},
    ],
}
# What each package may import of the others (module prefixes), and why.
OUTSIDE: dict[str, dict[str, str]] = {
    "training": {},
    "infra": {
        "platform_contract": "the names and rules infra and workloads agree on",
        "training.config": "the job's own parser checks the stack's `training` block at preview",
        "training.metrics.flops": "the preview's run-time bound",
        "training.metrics.cloudwatch_metrics": "the job's metric names, which the dashboard graphs",
    },
    "workloads": {
        "platform_contract": "the names and rules infra and workloads agree on",
        "infra": "sizes, settings, the AWS identity",
        "training.metrics.report": "the job's log lines",
        "training.metrics.efa_sysfs": "the EFA counters in sysfs and the node's counter reader",
        "training.metrics.cloudwatch_metrics": "the variable that names the cluster for the job's metrics",
        "training.config.settings": "the job's GPU switches and its --deadline, read in its arguments, and the variable naming a worker's node",
        "training.config.drain_budget": "the drain's arithmetic: Ray's stop margin and a worker's default grace",
    },
    "tools": {
        "infra.config": "the stack keys, for docs/configuration.md",
        "infra.resources.dashboard_picture": "the dashboard's picture, docs/dashboard.svg",
        "policy.rules": "the registered rules, for policy/README.md",
        "workloads.manifests": "the Helm chart pins, for docs/architecture.md",
    },
}
# What a package's imports of the others come to, beyond OUTSIDE's list.
OUTSIDE_NOTES = {
    "training": "nothing: only `training/` is shipped to the pods",
    "infra": "all standard library only, with every module they reach and every `__init__` that "
    "importing them runs",
    "tools": "the development tools: nothing of the product imports them",
}
# Packages that are one unit and import nothing of the program, and why.
ISOLATED = {
    "policy": "the pack runs in its own virtualenv and keeps copies, checked against the program's in `tests/policy/`"
}


def shown_layer(package: str, units: set[str]) -> str:
    """A layer as docs/architecture.md writes it: its units without the package's name, its own
    `__init__` left out."""
    names = sorted(unit.removeprefix(f"{package}.") for unit in units if unit != f"{package}.__init__")
    return ", ".join(f"`{name.replace('.__init__', '/__init__')}`" for name in names)


def table() -> str:
    """docs/architecture.md's table of the layers."""
    rows = []
    for package, layers in LAYERS.items():
        shown = " → ".join(filter(None, (shown_layer(package, units) for units in layers)))
        allowed = "; ".join(f"`{name}` ({why})" for name, why in OUTSIDE[package].items())
        outside = "; ".join(filter(None, (allowed, OUTSIDE_NOTES.get(package, ""))))
        rows.append(f"| `{package}` | {shown} | {outside} |")
    rows += [f"| `{package}` | one unit | nothing: {why} |" for package, why in ISOLATED.items()]
    return (
        "| package | layers, lowest first | of the rest of the program |\n| --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n"
    )
