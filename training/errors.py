"""Failures the CLI expects and reports in one line, without a traceback."""


class UsageError(ValueError):
    """A setting or environment that cannot work (no cluster, no GPU, model unreachable):
    the CLI prints the message, which names the fix, and exits 2."""


class RunFailedError(RuntimeError):
    """Training started but failed after its retries: the CLI exits 1."""
