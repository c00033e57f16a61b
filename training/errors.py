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


class RestartRefusedError(RunFailedError):
    """A restart that cannot help (a second fault in a row on one node, the recovery budget
    spent: `training.components.attempts.restart_refusal`). Every rank judges the same stored
    record alike and refuses before the model is built, so none waits in a collective."""


# The fix for a model or tokenizer that neither the Hub nor the cache holds.
MODEL_SOURCE_FIX = (
    "connect to the Hub, or download it beforehand (`huggingface-cli download {name}`) into the "
    "cache HF_HOME points at, or train from scratch with --init random"
)


def first_line(error: Exception) -> str:
    """The first line of an exception's message, for a one-line report; its type when it has none."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
