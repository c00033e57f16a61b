"""What a launcher provides to the loop (training/session.py): the `Session` each launcher's session
implements, and the loop's console line."""

from __future__ import annotations

import inspect

from training.session import Session, emit


def session_methods() -> set[str]:
    return {
        name
        for name, value in vars(Session).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def test_emit_writes_one_line_to_stdout(capsys):
    emit("step 1")
    emit("step 2")
    captured = capsys.readouterr()
    assert captured.out == "step 1\nstep 2\n" and captured.err == ""


def test_the_torchrun_session_provides_every_method_of_the_protocol():
    from training.launch.torchrun_launcher import TorchrunSession

    assert {"latest_checkpoint", "corpus", "report", "finish", "faults"} <= session_methods()
    assert (
        sorted(name for name in session_methods() if not callable(getattr(TorchrunSession, name, None))) == []
    )
