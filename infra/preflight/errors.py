"""The preflight's one error: the account or region cannot host the stack as configured."""

from __future__ import annotations

import pulumi


class PreflightError(pulumi.RunError):
    """The account or region cannot host the stack as configured; the message names the cause and the fix."""
