"""One command run somewhere and waited for: the `Executor` interface, its result, and `LocalExecutor`.

The training run decides from command results (`ExecResult`); `PodExecutor`
(`access.pod_exec`) runs a command in a pod, `LocalExecutor` runs it on this machine, which is how
the end-to-end test drives a real local Ray head through exactly the same commands.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

COMMAND_TIMEOUT_S = 120  # a short command in a pod (a `cat`, a log grep, a Jobs API call)


class CommandTimeout(Exception):
    """A command did not finish within its time limit."""


@dataclass(frozen=True)
class ExecResult:
    """Exit status and output of one command; stdout and stderr are kept apart for JSON parsing."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def output(self) -> str:
        """Both streams, for error messages."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)


class Executor(Protocol):
    """Runs a command somewhere (a pod, this machine) and waits for it."""

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult: ...


class LocalExecutor:
    """Runs a command on this machine: the local stand-in for a pod in tests and demos."""

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        self.env = dict(env) if env is not None else None
        self.cwd = cwd

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout_s, env=self.env, cwd=self.cwd
            )
        except subprocess.TimeoutExpired:
            raise CommandTimeout(f"`{argv[0]}` did not finish within {timeout_s:.0f} s") from None
        except FileNotFoundError as error:
            return ExecResult(127, "", str(error))
        return ExecResult(done.returncode, done.stdout, done.stderr)
