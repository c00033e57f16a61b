"""The run schema: the TrainingRun's inputs and its time limits, each declared once, here.

Each field's type says what it accepts, and `check`, the typed inputs of `create` and the
environment overrides of the time limits are all validated from these declarations (pydantic).
An input's metadata says whether it is part of the job's identity (its submission id) and
whether a change runs the job again; its `reason` is what `check` says of a bad value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

import pulumi
from pulumi.runtime import rpc
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)

from infra.aws_rules.reservation_window import DEADLINE_KEY, RESERVATION_KEY, DeadlineCheck
from infra.config.stack import GPU_NODES_AFTER_TRAINING, KEEP, RELEASE
from infra.planner.cost import PredictedRun
from platform_contract import EXPECTABLE_TRANSPORTS
from workloads.training_run.access.call_bounds import ApiTimeouts
from workloads.training_run.errors import TrainingRunError

ENV_PREFIX = "EKS_RAY_TRAIN_"


def _whole(value: Any) -> Any:
    """A count: the engine hands numbers over as floats (4.0); true/false or 4.5 are no counts."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError("not a whole number")
    return int(value)


def _utc_time(value: str) -> str:
    """An ISO 8601 time with its offset: the engine's machine and the preview's need not share a zone."""
    if datetime.fromisoformat(value).tzinfo is None:
        raise ValueError("no UTC offset")
    return value


def _expectable(value: str) -> str:
    if value not in EXPECTABLE_TRANSPORTS:
        raise ValueError("not an expectable transport")
    return value


Name = Annotated[str, Field(strict=True, min_length=1)]
Count = Annotated[int, BeforeValidator(_whole)]
Transport = Annotated[str, Field(strict=True), AfterValidator(_expectable)]


def _nodes_after(value: str) -> str:
    if value not in GPU_NODES_AFTER_TRAINING:
        raise ValueError("not a known mode")
    return value


NodesAfter = Annotated[str, Field(strict=True), AfterValidator(_nodes_after)]


def _list(value: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ValueError("not a list")
    return tuple(value)


JobArgs = Annotated[tuple[Annotated[str, Field(strict=True)], ...], BeforeValidator(_list)]


def _checkable(value: DeadlineCheck) -> DeadlineCheck:
    if value.key not in (DEADLINE_KEY, RESERVATION_KEY) or not value.least_s > 0:
        raise ValueError("not a deadline check")
    return value


def _input(reason: str, *, identity: bool = False, rerun: bool = True, **kwargs: Any) -> Any:
    return Field(json_schema_extra={"identity": identity, "rerun": rerun, "reason": reason}, **kwargs)


NON_EMPTY = "must be a non-empty string"


class RunInputs(BaseModel):
    """The resource's inputs. `identity`: part of the job's submission id; `rerun`: a change runs it again."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cluster_name: Name = _input(NON_EMPTY, identity=True)
    region: Name = _input(NON_EMPTY, identity=True)
    namespace: Name = _input(NON_EMPTY, identity=True)
    ray_cluster_name: Name = _input(NON_EMPTY, identity=True)
    gpus_per_node: Annotated[Count, Field(ge=1)] = _input("must be a whole number of at least 1")
    efa_per_node: Annotated[Count, Field(ge=0)] = _input("must be a whole number, 0 or more")
    code_hash: Name = _input(NON_EMPTY, identity=True)
    run_spec_hash: Name = _input(NON_EMPTY, identity=True)
    gpu_instance_type: Name = _input(NON_EMPTY, identity=True)
    job_args: JobArgs = _input("must be a list of strings (flags of `python -m training`)", identity=True)
    expect_transport: Transport = _input(f"must be one of {', '.join(EXPECTABLE_TRANSPORTS)}", default="efa")
    benchmark: Annotated[bool, Field(strict=True)] = _input("must be true or false", default=False)
    line_rate_gbps: Annotated[float, Field(gt=0)] | None = _input(
        "must be a positive number (Gbit/s)", default=None, rerun=False
    )
    min_busbw_fraction: Annotated[float, Field(ge=0, le=1)] = _input(
        "must be a number from 0 to 1", default=0.0
    )
    # False: the EFA counters are read and reported but judged by nobody (the outputs say so).
    check_efa_counters: Annotated[bool, Field(strict=True)] = _input("must be true or false", default=True)
    timeout_minutes: Annotated[Count, Field(ge=1)] = _input(
        "must be a whole number of at least 1", default=60, rerun=False
    )
    # The GPU node group and what becomes of it after the run (`gpu_nodes`): where the job runs is
    # the cluster, so none of them reruns the job or names it.
    node_group_name: Name | None = _input(NON_EMPTY, default=None, rerun=False)
    gpu_node_count: Annotated[Count, Field(ge=1)] | None = _input(
        "must be a whole number of at least 1", default=None, rerun=False
    )
    gpu_nodes_after_training: NodesAfter = _input(
        f"must be one of {', '.join(GPU_NODES_AFTER_TRAINING)}", default=KEEP, rerun=False
    )
    # A Capacity Block's start, when it has not begun: the run waits for it before the GPU nodes.
    not_before: Annotated[str, Field(strict=True), AfterValidator(_utc_time)] | None = _input(
        "must be an ISO 8601 time with its UTC offset", default=None, rerun=False
    )

    # The preview's refusal of a run that cannot fit before its --deadline, made again by the run when
    # it is about to run, at its own time (`runner`).
    deadline_check: Annotated[DeadlineCheck, AfterValidator(_checkable)] | None = _input(
        f"must be an object of key ({DEADLINE_KEY} or {RESERVATION_KEY}), value, fix and a positive least_s",
        default=None,
        rerun=False,
    )
    # What the preview priced and predicted the run at. `create` returns its inputs among its outputs,
    # so the run records them, and the stack's measured cost and forecast comparison are computed from them.
    # The forecast keeps its recorded name `planned`: renaming an input would change every recorded run.
    # Its None values reach the provider as missing keys, read as None (`PredictedRun`).
    planned: PredictedRun | None = _input(
        "must be an object of price_basis and, where known, usd_per_gpu_node_hour, step_time_s and "
        "bytes_per_step (numbers)",
        default=None,
        rerun=False,
    )

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> RunInputs:
        """Typed from what the engine hands over (numbers arrive as floats, lists as lists)."""
        return cls.model_validate({key: props[key] for key in INPUTS if key in props})

    def props(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def job_identity(self) -> dict[str, Any]:
        return {key: value for key, value in self.props().items() if key in IDENTITY_INPUTS}


def _meta(name: str, key: str) -> Any:
    extra = RunInputs.model_fields[name].json_schema_extra
    assert isinstance(extra, dict)
    return extra[key]


INPUTS = tuple(RunInputs.model_fields)
RERUN_INPUTS = tuple(name for name in INPUTS if _meta(name, "rerun"))
IDENTITY_INPUTS = frozenset(name for name in INPUTS if _meta(name, "identity"))


def is_known(value: Any) -> bool:
    """False for None and for a value the engine does not know yet (preview), or that holds one at
    any depth: a list or map may be known while an element or value of it is not.

    The dynamic-provider host deserializes Check's and Diff's properties with `keep_unknowns`
    (`rpc.deserialize_properties(request.news, True)`, pulumi/dynamic/__main__.py `Check` and
    `Diff`), which makes every unknown, at the top or inside a list or map, a `pulumi.output.Unknown`
    object (pulumi/runtime/rpc.py `deserialize_property` deserializes a list's elements and,
    through `deserialize_properties`, a map's values as it does the top); the sentinel string
    `rpc.UNKNOWN` is what they are on the wire.
    """
    return value is not None and not _holds_unknown(value)


def _holds_unknown(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_unknown(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_unknown(item) for item in value.values())
    return isinstance(value, pulumi.output.Unknown) or value == rpc.UNKNOWN


def efa_problem(expect_transport: str, efa_per_node: int) -> str | None:
    """The rule across two inputs: EFA is expected only of nodes that have it."""
    if expect_transport == "efa" and efa_per_node < 1:
        return "expecting the efa transport needs at least 1 EFA interface per node"
    return None


def _validator(name: str) -> TypeAdapter:
    field = RunInputs.model_fields[name]
    if not field.metadata:  # an optional input: its constraints sit inside the union
        return TypeAdapter(field.rebuild_annotation())
    return TypeAdapter(Annotated.__class_getitem__((field.annotation, *field.metadata)))  # type: ignore[attr-defined]


_VALIDATORS = {name: _validator(name) for name in INPUTS}


def input_problems(props: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(input, reason) for each input that cannot work, by its declaration; an input that is or holds a
    value not known yet (preview) passes, and is checked again once known (`pulumi up`)."""
    problems: list[tuple[str, str]] = []
    valid: dict[str, Any] = {}
    for name in INPUTS:
        value = props.get(name)
        if value is None:
            if RunInputs.model_fields[name].is_required():
                problems.append((name, "is required"))
        elif is_known(value):
            try:
                valid[name] = _VALIDATORS[name].validate_python(value)
            except ValidationError:
                problems.append((name, _meta(name, "reason")))
    if valid.get("gpu_nodes_after_training") == RELEASE and (
        missing := [name for name in ("node_group_name", "gpu_node_count") if props.get(name) is None]
    ):
        problems += [(name, "is required with gpu_nodes_after_training release") for name in missing]
    if {"expect_transport", "efa_per_node"} <= valid.keys() and (
        problem := efa_problem(valid["expect_transport"], valid["efa_per_node"])
    ):
        problems.append(("efa_per_node", problem))
    return problems


Positive = Annotated[float, Field(gt=0)]


class RunTimings(BaseModel):
    """Time limits of a run; each can be set in the environment of `pulumi up` (`EKS_RAY_TRAIN_<NAME>`)."""

    model_config = ConfigDict(frozen=True)

    api_connect_timeout_s: Positive = ApiTimeouts.connect_s
    api_read_timeout_s: Positive = ApiTimeouts.read_s
    api_attempts: Annotated[int, Field(gt=0)] = ApiTimeouts.attempts
    api_backoff_s: Positive = ApiTimeouts.backoff_s
    poll_interval_s: Positive = 10.0
    readiness_timeout_s: Positive = 20 * 60  # node join, device plugins, and a ~20 GB image pull
    code_sync_timeout_s: Positive = 5 * 60  # kubelet sync period plus its ConfigMap cache TTL

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RunTimings:
        values = {
            name: environ[ENV_PREFIX + name.upper()]
            for name in cls.model_fields
            if ENV_PREFIX + name.upper() in environ
        }
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            name = ENV_PREFIX + str(error.errors()[0]["loc"][0]).upper()
            raise TrainingRunError(
                f"environment variable {name}={environ[name]!r}: must be a positive "
                + ("whole number" if name.endswith("_ATTEMPTS") else "number")
            ) from None

    @property
    def api(self) -> ApiTimeouts:
        return ApiTimeouts(
            self.api_connect_timeout_s, self.api_read_timeout_s, self.api_attempts, self.api_backoff_s
        )
