"""A Ray Train worker's death as Ray reports it, and the hosts of a two-worker run: the faults that
the attempts' tests (tests/training/components/test_attempts.py) and the controller's callback's
(tests/training/launch/test_attempt_store.py) record."""

from __future__ import annotations

from ray.core.generated.common_pb2 import ActorDiedErrorContext, NodeDeathInfo
from ray.exceptions import ActorDiedError

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
# Why Ray's GCS says an actor died (ray src/ray/gcs/gcs_actor_manager.cc: the death cause of a worker
# process that exited, e.g. on SIGABRT from ProcessGroupNCCL's watchdog, and of an actor whose node
# died or was drained).
PROCESS_DIED = (
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
    "detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
    "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage."
)
NODE_DIED = "The actor is dead because its node has died. Node Id: 5c2b7a0e41f3"


def actor_death(why: str, *, preempted: bool = False, pid: int = 4121) -> ActorDiedError:
    """The real `ActorDiedError` Ray Train's poll hands the controller for a worker whose actor died:
    built from the GCS's death context as Ray's core worker builds it (ray/exceptions.py); a
    drained node's death carries `AUTOSCALER_DRAIN_PREEMPTED`, which sets `preempted`."""
    death_info = NodeDeathInfo(
        reason=NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
        if preempted
        else NodeDeathInfo.UNEXPECTED_TERMINATION,
        reason_message="received SIGTERM" if preempted else "health check failed",
    )
    context = ActorDiedErrorContext(
        class_name="RayTrainWorker",
        actor_id=bytes(16),
        pid=pid,
        node_ip_address="10.0.1.9",
        error_message=why,
        node_death_info=death_info,
    )
    return ActorDiedError(cause=context)
