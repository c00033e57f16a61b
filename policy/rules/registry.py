"""The rule objects, the registry each rule adds itself to, and the thin adapters to pulumi-policy.

A rule is a pure function of a resource's type and properties (a resource rule) or of the stack's
resources (a stack rule), turned by `resource_rule` or `stack_rule` into one object that carries
its name, enforcement level, description and the documentation's columns, and that registers
itself: the pack (`policy/__main__.py`) and its README table (`python -m tools docs`) are built
from `registered()`.

Resource rules: `check(resource_type, props, stack) -> [violation message, ...]`.
Stack rules: `check([StackResource, ...]) -> [(urn, violation message), ...]`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.deserialize import serialize_properties

from .properties import StackResource, stack_of

MANDATORY = EnforcementLevel.MANDATORY
ADVISORY = EnforcementLevel.ADVISORY

ResourceCheck = Callable[[str, Mapping[str, Any], str], list[str]]
StackCheck = Callable[[Sequence[StackResource]], list[tuple[str, str]]]


def plain(props: Any) -> Any:
    """Plain dicts and lists from pulumi-policy's unknown-checking proxies, unknowns left as sentinels.

    The proxies raise on reading an unknown value; the rules would rather see it and skip it.
    """
    return serialize_properties(props)


@dataclass(frozen=True)
class ResourceRule:
    """A rule applied to each resource on its own. `resources` and `requires` are the README's
    columns: which resources it checks, and what it requires of them."""

    name: str
    description: str
    enforcement: EnforcementLevel
    check: ResourceCheck
    resources: str
    requires: str

    def to_policy(self) -> ResourceValidationPolicy:
        def validate(args: ResourceValidationArgs, report_violation) -> None:
            for message in self.check(args.resource_type, plain(args.props), stack_of(args.urn)):
                report_violation(message, None)

        return ResourceValidationPolicy(
            name=self.name,
            description=self.description,
            enforcement_level=self.enforcement,
            validate=validate,
        )


@dataclass(frozen=True)
class StackRule:
    """A rule that needs several resources at once (a node group and its launch template)."""

    name: str
    description: str
    enforcement: EnforcementLevel
    check: StackCheck
    resources: str
    requires: str

    def to_policy(self) -> StackValidationPolicy:
        def validate(args: StackValidationArgs, report_violation) -> None:
            resources = [
                StackResource(
                    type=resource.resource_type,
                    urn=resource.urn,
                    props=plain(resource.props),
                    dependencies=tuple(
                        {dep.urn for dep in resource.dependencies}
                        | {dep.urn for deps in resource.property_dependencies.values() for dep in deps}
                    ),
                )
                for resource in args.resources
            ]
            for urn, message in self.check(resources):
                report_violation(message, urn)

        return StackValidationPolicy(
            name=self.name,
            description=self.description,
            enforcement_level=self.enforcement,
            validate=validate,
        )


Rule = ResourceRule | StackRule
_REGISTERED: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    """Add a rule to the pack; a second rule of the same name is a mistake, refused at import."""
    if rule.name in _REGISTERED:
        raise ValueError(f"policy rule {rule.name} is registered twice: give each rule its own name")
    _REGISTERED[rule.name] = rule
    return rule


def registered() -> tuple[Rule, ...]:
    """Every rule, in the order the area modules define them."""
    return tuple(_REGISTERED.values())


def resource_rule(
    name: str, enforcement: EnforcementLevel, *, description: str, resources: str, requires: str
) -> Callable[[ResourceCheck], ResourceRule]:
    """The decorated check as a registered resource rule."""

    def make(check: ResourceCheck) -> ResourceRule:
        rule = ResourceRule(name, description, enforcement, check, resources, requires)
        register(rule)
        return rule

    return make


def stack_rule(
    name: str, enforcement: EnforcementLevel, *, description: str, resources: str, requires: str
) -> Callable[[StackCheck], StackRule]:
    """The decorated check as a registered stack rule."""

    def make(check: StackCheck) -> StackRule:
        rule = StackRule(name, description, enforcement, check, resources, requires)
        register(rule)
        return rule

    return make
