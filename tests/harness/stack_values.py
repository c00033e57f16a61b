"""A stack's values parsed as `pulumi preview` parses them, without an engine: the dev stack in
us-east-2, with the one key every stack needs (who may reach the public API endpoint) and the keys a
test sets. Shared by the tests of `infra/config/` and of the modules that size from the settings."""

from __future__ import annotations

from typing import Any

from infra.config.stack import StackSettings, parse_settings

CIDRS = {"endpointPublicAccessCidrs": '["203.0.113.7/32"]'}


def parse(**values: Any) -> StackSettings:
    return parse_settings({**CIDRS, **values}, "us-east-2", stack="dev")
