"""The communication planner: before anything exists, what a stack's training job costs per step
in inter-node bytes, time, tokens/s and dollars, per sharding strategy.

`python -m infra.planner --stack NAME [--json] [--line-rate-gbps X] [--offline]` forecasts from the stack
file, with the line rate and price AWS states now unless --offline (`infra.planner.refresh`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from infra.planner.figures import INSTANCES
from infra.planner.planner import cluster_of, configured_replicas, forecast, workload_of
from infra.planner.refresh import refreshed
from infra.planner.report import forecast_rows, forecast_table, network_warning

ROOT = Path(__file__).resolve().parents[2]


def stack_values(stack: str) -> tuple[dict[str, Any], str | None]:
    """The project's keys of `Pulumi.<stack>.yaml` (objects as JSON text, as the engine passes
    them) and its `aws:region`."""
    path = ROOT / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml")))
        raise SystemExit(f"--stack {stack}: no Pulumi.{stack}.yaml; stacks here: {names}")
    config = yaml.safe_load(path.read_text()).get("config", {})
    from platform_contract import PROJECT

    prefix = f"{PROJECT}:"
    values = {
        key[len(prefix) :]: value if isinstance(value, str) else json.dumps(value)
        for key, value in config.items()
        if key.startswith(prefix)
    }
    return values, config.get("aws:region")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.planner", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack whose Pulumi.<stack>.yaml to forecast")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--line-rate-gbps", type=float, help="override the line rate (e.g. to forecast TCP)")
    parser.add_argument("--offline", action="store_true", help="use the shipped figures without asking AWS")
    args = parser.parse_args(argv)
    if args.line_rate_gbps is not None and not args.line_rate_gbps > 0:
        parser.error("--line-rate-gbps: expected a positive number of Gbps")

    from infra.config.parsing import ConfigError, validated
    from infra.config.stack import StackKeys
    from infra.config.training_settings import training_config

    values, region = stack_values(args.stack)
    try:
        keys = validated(
            StackKeys, {k: values[k] for k in ("gpuNodeType", "gpuNodeCount", "training") if k in values}
        )
    except ConfigError as err:
        raise SystemExit(f"Pulumi.{args.stack}.yaml: {err}") from None
    figures = INSTANCES.get(keys.gpu_node_type)
    if figures is None:
        raise SystemExit(
            f"config key 'gpuNodeType' = {keys.gpu_node_type!r}: the planner has figures for "
            f"{', '.join(INSTANCES)} only (infra/planner/figures.py)"
        )
    source = "shipped figures (--offline)"
    if not args.offline:
        figures, source = refreshed(keys.gpu_node_type, region or "us-east-1", figures)
    world = keys.gpu_node_count * figures.gpus
    flags = list(keys.training.flags)
    config = training_config(
        [*flags, "--use-gpu", *([] if "--workers" in flags else ["--workers", str(world)])]
    )
    workload = workload_of(config)
    if workload is None:
        raise SystemExit(f"training model config {config.model_config!r} is not shipped: nothing to forecast")
    cluster = cluster_of(keys.gpu_node_type, keys.gpu_node_count, figures, args.line_rate_gbps)
    forecasts = forecast(workload, cluster)
    chosen = configured_replicas(config, cluster)
    if args.json:
        print(json.dumps({"line_rate_gbps": cluster.line_rate_gbps, "strategies": forecast_rows(forecasts)}))
        return 0
    print(
        f"{args.stack}: preset {config.preset}, seq {config.seq_len} x batch {config.batch_size} x "
        f"{config.grad_accum_steps} micro-batches, {keys.gpu_node_type} ({source})"
    )
    print(forecast_table(forecasts, cluster, chosen))
    if chosen in (1, cluster.nodes):
        warning = network_warning(workload, cluster, chosen)
        if warning:
            print(f"warning: {warning}")
    return 0
