"""The stack's configuration as the Pulumi engine holds it: the values read from the running program,
the Hugging Face token kept a secret, and `load_settings`, which parses them at preview."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.config.cross_keys import moving_tag_warning
from infra.config.parsing import ConfigError
from infra.config.stack import StackSettings, parse_settings
from platform_contract import PROJECT

__all__ = ["hf_token", "load_settings", "stack_config_values"]


def stack_config_values(project: str = PROJECT) -> dict[str, Any]:
    """Every value the engine passed for the project's namespace, keyed without the namespace."""
    merged = {**pulumi.runtime.config.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{project}:"
    return {key[len(prefix) :]: value for key, value in merged.items() if key.startswith(prefix)}


def hf_token() -> pulumi.Output[str] | None:
    """The Hugging Face token for gated models, as a secret Output (never a plain string)."""
    return pulumi.Config(PROJECT).get_secret("hfToken")


def load_settings() -> StackSettings:
    """Read and validate the current stack's configuration."""
    settings = parse_settings(
        stack_config_values(),
        pulumi.Config("aws").get("region"),
        stack_config_values("aws"),
        stack=pulumi.get_stack(),
    )
    if settings.has_hf_token and not pulumi.runtime.is_config_secret(f"{PROJECT}:hfToken"):
        raise ConfigError(
            "config key 'hfToken' is stored in plain text in the stack file: run "
            "`pulumi config set --secret hfToken <token>` (and revoke the token if the file was shared)"
        )
    warning = moving_tag_warning(settings.image)
    if warning:
        pulumi.log.warn(warning)
    return settings
