"""What the stock Python dynamic-provider host does not do for the training run, added from inside.

The engine runs dynamic providers in `python -m pulumi.dynamic` (pulumi/dynamic/__main__.py of
the `pulumi` package; read in 3.272). In that host:

- `Cancel`, the RPC the engine sends on the first Ctrl-C, answers and tells the provider nothing,
  while the engine waits for the running Create: a Create following an hour-long job holds
  `pulumi up` for that hour;
- SIGINT makes the host stop its gRPC server and exit, but the interpreter first joins the
  thread still running the Create, so the process lives on until the job ends;
- every exception of create/update/... is sent to the engine as `traceback.format_exc()`: the
  user reads a Python traceback with the message on its last line.

`install()` is called by the provider once the host has loaded it. It makes the host's Cancel
handler (the function object the gRPC server already holds) also set `CANCELLED`, sets
`CANCELLED` when the interpreter shuts down (after SIGINT), and gives the host's error path the
message of a `TrainingRunError` instead of the traceback, which goes to `LOG_FILE`; any other
exception becomes one line naming it and that file (`unexpected_failure`). The file lives in the
user's own state folder (`$XDG_STATE_HOME/eks-ray-train`, else `~/.local/state/eks-ray-train`,
the XDG Base Directory specification's user state folder), kept at mode 0700, and is never
reached through a symbolic link, so no other user of the machine reads the tracebacks or points the
writes elsewhere (`_open_log`). The runner's
waits end as soon as `CANCELLED` is set. Outside that host (tests calling the provider in-process)
it changes nothing. The tests start the real host and check each of these through gRPC.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import stat
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2

from platform_contract import PROJECT
from workloads.training_run.errors import JOB_KEEPS_RUNNING, Interrupted, TrainingRunError


def _state_folder() -> Path:
    """The user's state folder of the project: `$XDG_STATE_HOME` (used only when absolute, as the XDG
    Base Directory specification says), else `~/.local/state`."""
    configured = os.environ.get("XDG_STATE_HOME", "")
    base = Path(configured) if os.path.isabs(configured) else Path.home() / ".local" / "state"
    return base / PROJECT


LOG_FILE = _state_folder() / "training-run.log"
# The folder of the log is this user's alone: no permission for the group or others.
_PRIVATE = 0o700
CANCELLED = threading.Event()
_eks_ray_train_cancelled = CANCELLED  # the name the host's Cancel looks up once installed
_installed = threading.Lock()


def _cancel(self, request, context):  # runs as the host's Cancel, with its globals
    _eks_ray_train_cancelled.set()
    return empty_pb2.Empty()


def cancellable_sleep(seconds: float) -> None:
    """`time.sleep` that ends early, raising `Interrupted`, once `pulumi up` is interrupted."""
    if CANCELLED.wait(seconds):
        raise Interrupted("pulumi up was interrupted")


def _open_log() -> int:
    """The log file, opened for appending (created with mode 0600), in a folder created with mode 0700.

    The folder must belong to this user; one left more open is closed to 0700. Neither the folder nor
    the file is followed when it is a symbolic link (`O_NOFOLLOW`, and the file opened relative to the
    folder's descriptor): OSError instead.
    """
    folder = LOG_FILE.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=_PRIVATE)
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        status = os.fstat(descriptor)
        if status.st_uid != os.getuid():
            raise PermissionError(f"{folder} belongs to another user")
        if stat.S_IMODE(status.st_mode) != _PRIVATE:
            os.fchmod(descriptor, _PRIVATE)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        return os.open(LOG_FILE.name, flags, 0o600, dir_fd=descriptor)
    finally:
        os.close(descriptor)


def log_detail(text: str) -> None:
    """Append to the provider's log file (not shown by the CLI); nothing when it cannot be opened safely."""
    with contextlib.suppress(OSError), os.fdopen(_open_log(), "a") as log:
        log.write(f"--- {datetime.datetime.now(datetime.UTC).isoformat()}\n{text}\n")


def unexpected_failure(error: BaseException) -> str:
    """One line for a failure the provider has no explanation for: what it was, where its traceback is."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 300 else text[:300] + "..."
    return (
        f"the training run failed unexpectedly ({type(error).__name__}: {text}); this is a defect of the "
        f"provider: please report it with the traceback in {LOG_FILE}. {JOB_KEEPS_RUNNING}"
    )


class _MessageOnlyTraceback:
    """The host's `traceback` module, except that a `TrainingRunError` formats as its message."""

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    def format_exc(self, limit: int | None = None, chain: bool = True) -> str:
        error = sys.exc_info()[1]
        detail = traceback.format_exc(limit=limit, chain=chain)
        if error is None:
            return detail
        log_detail(detail)
        if isinstance(error, TrainingRunError):
            return f"{error}\n(details in {LOG_FILE})"
        return unexpected_failure(error)


def _host_module() -> Any:
    host = sys.modules.get("__main__")
    servicer = getattr(host, "DynamicResourceProviderServicer", None)
    if servicer is None or getattr(host, "traceback", None) is None:
        return None
    return host


def install() -> bool:
    """Hook the host as described above; True when running inside it."""
    host = _host_module()
    if host is None:
        return False
    with _installed:
        if isinstance(host.traceback, _MessageOnlyTraceback):
            return True
        host._eks_ray_train_cancelled = CANCELLED
        host.DynamicResourceProviderServicer.Cancel.__code__ = _cancel.__code__
        host.traceback = _MessageOnlyTraceback()
        register = getattr(threading, "_register_atexit", None)  # runs before threads are joined
        if register is not None:
            with contextlib.suppress(RuntimeError):
                register(CANCELLED.set)
    return True
