"""A Ray Train worker's death as Ray reports it, and the hosts of a two-worker run: the faults that
the attempts' tests (tests/training/components/test_attempts.py) and the controller's callback's
(tests/training/launch/test_attempt_store.py) record."""

from __future__ import annotations

from training.components.attempts import ACTOR_DIED

# An actor death as Ray words it: its fixed first line, tab-indented fields, then why
# (ray/exceptions.py, ActorDiedError.__init__), as the controller logged it for a SIGKILLed worker.
DEATH = "\n".join(
    [
        ACTOR_DIED,
        "\tclass_name: RayTrainWorker",
        "\tpid: 26248",
        "\tip: 192.0.2.2",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker "
        "exit detail: Worker unexpectedly exits with a connection error code 2. End of file.",
    ]
)
HOSTS = {0: "ray-worker-a", 1: "ray-worker-b"}
