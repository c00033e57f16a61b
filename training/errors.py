"""Failures the CLI expects and reports in one line, without a traceback."""


class UsageError(ValueError):
    """A setting or environment that cannot work (no cluster, no GPU, model unreachable):
    the CLI prints the message, which names the fix, and exits 2."""


class RunFailedError(RuntimeError):
    """Training started but failed after its retries: the CLI exits 1."""


class DivergedError(RunFailedError):
    """The loss or gradient norm went non-finite. Every rank raises it at the same step (it
    judges all-reduced values), before that step's optimizer step and checkpoint; a retry
    from the last checkpoint would only diverge again."""
