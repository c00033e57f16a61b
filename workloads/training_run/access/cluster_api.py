"""The training run's cluster queries and its two writes (`ClusterApi`), and their implementation
over the Kubernetes Python client (`KubernetesCluster`).

The training run decides from plain facts (`NodeFacts`, `PodFacts`); only this module converts
Kubernetes objects into them. Its writes are what a job's follower does to keep a run alive on a
failing node (`job_following`): cordon a node, and delete a pod, with its own grace or at once. Tests hand `KubernetesCluster` a fake `CoreV1Api`, so the conversion
is exercised without a cluster. A 401/403 becomes `ApiUnauthorized`; an endpoint that never
answers `ApiUnreachable` (`EndpointNameUnresolved` when its name does not resolve); an answer
still refused when the attempts are spent `ApiRefused`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from workloads.training_run.access.call_bounds import (
    DEFAULT_TIMEOUTS,
    RETRY_STATUSES,
    ApiTimeouts,
    name_unresolved,
    pause,
    retry_delay,
    short,
)
from workloads.training_run.access.commands import COMMAND_TIMEOUT_S, Executor
from workloads.training_run.access.pod_exec import PodExecutor
from workloads.training_run.errors import (
    ApiRefused,
    ApiUnauthorized,
    ApiUnreachable,
    EndpointNameUnresolved,
    RayClusterNotFound,
    TrainingRunError,
)

T = TypeVar("T")
# The merge that `kubectl cordon` and `kubectl patch` send for a built-in kind.
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class NodeFacts:
    """What the checks need to know about one node."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    ready: bool
    # spec.providerID: on EKS `aws:///<zone>/<instance id>`, set by the cloud provider when the node
    # registers; "" where it is not set.
    provider_id: str = ""
    # The Ready condition's status as the node controller keeps it: "True", "False" (the kubelet says
    # it is not ready), "Unknown" (the kubelet stopped posting its status), "" (no Ready condition
    # yet); and when it last changed, in seconds since the epoch (None: not stated).
    ready_status: str = ""
    ready_changed_at: float | None = None
    unschedulable: bool = False  # spec.unschedulable: cordoned


@dataclass(frozen=True)
class PodFacts:
    """What the readiness wait and the exec need to know about one pod.

    `container` is the pod's first container: KubeRay requires the Ray container to be first.
    `problems` are waiting/terminated reasons of its containers (`ImagePullBackOff: ...`).
    """

    name: str
    phase: str
    ready: bool
    container: str
    node_name: str | None = None
    terminating: bool = False
    problems: tuple[str, ...] = field(default_factory=tuple)
    annotations: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""  # metadata.uid: a pod replaced under the same name has a new one
    namespace: str = ""  # metadata.namespace: the Ray pods' or the EFA counter readers'
    # metadata.deletionTimestamp in seconds since the epoch: when the API server set it, the time of
    # the delete plus the pod's grace, by which the kubelet was to have ended it (None: not deleted).
    deleted_at: float | None = None


def stdout_of_each_pod(
    pods: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor], argv: list[str], what: str
) -> dict[str, str]:
    """`argv` run in each pod: pod name -> its stdout. A failure names `what` was being read, the
    pod, the exit status and the output."""
    found = {}
    for pod in pods:
        result = executor_for(pod).run(argv, COMMAND_TIMEOUT_S)
        if result.returncode != 0:
            raise TrainingRunError(
                f"reading {what} of worker pod {pod.name} failed (exit {result.returncode}): {result.output}"
            )
        found[pod.name] = result.stdout
    return found


class ClusterApi(Protocol):
    """The cluster queries of the training run, and the two writes of its job's follower."""

    def list_nodes(self, label_selector: str) -> list[NodeFacts]: ...

    def list_pods(self, namespace: str, label_selector: str) -> list[PodFacts]: ...

    def pod_events(self, namespace: str, pod_name: str) -> list[str]: ...

    def ray_cluster_worker_count(self, namespace: str, name: str) -> int: ...

    def cordon_node(self, name: str) -> bool:
        """Mark the node unschedulable (`spec.unschedulable: true`, as `kubectl cordon`); False when
        there is no such node."""
        ...

    def delete_pod(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        """Delete the pod: with its own grace (None), or `grace_period_seconds` (0: at once, without
        waiting for its kubelet); False when there is no such pod."""
        ...


class KubernetesCluster:
    """`ClusterApi` over the Kubernetes Python client (`CoreV1Api`, `CustomObjectsApi`)."""

    EVENTS_PER_POD = 5

    def __init__(
        self,
        core_api,
        custom_objects_api,
        endpoint: str = "",
        timeouts: ApiTimeouts = DEFAULT_TIMEOUTS,
        cancelled: threading.Event | None = None,
    ) -> None:
        self._core = core_api
        self._custom = custom_objects_api
        self.endpoint = endpoint
        self.timeouts = timeouts
        self.cancelled = cancelled or threading.Event()
        self.accepted = False  # the API answered a call: it knows the caller's identity

    def _call(self, what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One REST call, bounded by `timeouts`: the client's urllib3 retries a connection that
        fails, this loop an answer in `RETRY_STATUSES`. Each call may be asked twice: the GETs, the
        cordon (it sets one field to one value) and a delete (asked again after it took effect, it
        finds no pod: `delete_pod` says so)."""
        for attempt in range(1, self.timeouts.attempts + 1):
            try:
                answer = method(*args, _request_timeout=self.timeouts.request_timeout, **kwargs)
                self.accepted = True
                return answer
            except ApiException as error:
                if error.status in (401, 403):
                    raise ApiUnauthorized(error.status, what, short(error.reason, error.body)) from error
                if error.status not in RETRY_STATUSES:
                    raise
                if attempt == self.timeouts.attempts:
                    raise ApiRefused(
                        error.status,
                        what,
                        f"{short(error.reason, error.body)} ({self.timeouts.attempts} attempts)",
                    ) from error
                pause(
                    self.cancelled,
                    retry_delay(attempt, (error.headers or {}).get("Retry-After"), self.timeouts.backoff_s),
                    what,
                )
            except urllib3.exceptions.HTTPError as error:
                unreachable = EndpointNameUnresolved if name_unresolved(error) else ApiUnreachable
                raise unreachable(
                    self.endpoint, what, f"{self.timeouts.describe()}; last error: {short(str(error))}"
                ) from error
        raise AssertionError("unreachable")

    def list_nodes(self, label_selector: str) -> list[NodeFacts]:
        nodes = self._call("listing nodes", self._core.list_node, label_selector=label_selector).items
        return [_node_facts(node) for node in nodes]

    def list_pods(self, namespace: str, label_selector: str) -> list[PodFacts]:
        pods = self._call(
            "listing pods", self._core.list_namespaced_pod, namespace, label_selector=label_selector
        ).items
        return [_pod_facts(pod) for pod in pods]

    def pod_events(self, namespace: str, pod_name: str) -> list[str]:
        """The pod's latest events, warnings first: they say why a pod is stuck."""
        events = self._call(
            "listing events",
            self._core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
        ).items
        events = sorted(events, key=_event_time)[-self.EVENTS_PER_POD :]
        events.sort(key=lambda event: event.type != "Warning")
        return [
            f"{event.type} {event.reason}: {(event.message or '').strip()}"
            + (f" (x{event.count})" if event.count and event.count > 1 else "")
            for event in events
        ]

    def ray_cluster_worker_count(self, namespace: str, name: str) -> int:
        """Worker pods the RayCluster asks for: replicas (times hosts) summed over its groups."""
        try:
            body = self._call(
                "reading the RayCluster",
                self._custom.get_namespaced_custom_object,
                "ray.io",
                "v1",
                namespace,
                "rayclusters",
                name,
            )
        except ApiException as error:
            if error.status == 404:
                raise RayClusterNotFound(
                    f"RayCluster {namespace}/{name} does not exist: the program creates it before the "
                    "TrainingRun, so it was deleted outside Pulumi; run `pulumi refresh`, then `pulumi up` "
                    "creates it again"
                ) from None
            raise
        groups = body.get("spec", {}).get("workerGroupSpecs", [])
        return sum(int(group.get("replicas", 0)) * int(group.get("numOfHosts", 1)) for group in groups)

    def cordon_node(self, name: str) -> bool:
        """`kubectl cordon`: a strategic merge patch of `spec.unschedulable`. The content type is
        named: the client's default for a PATCH is JSON Patch, a list of operations, which the
        client 37.0.1 turns into a strategic merge for an object body (kubernetes/client/rest.py,
        `RESTClientObject.request`); named, the patch does not rest on that."""
        try:
            self._call(
                f"cordoning node {name}",
                self._core.patch_node,
                name,
                {"spec": {"unschedulable": True}},
                _content_type=STRATEGIC_MERGE_PATCH,
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        """A pod deleted with its own `terminationGracePeriodSeconds` (None), or another grace; 0
        removes it at once ("The value zero indicates delete immediately", `DeleteOptions`)."""
        grace = {} if grace_period_seconds is None else {"grace_period_seconds": grace_period_seconds}
        try:
            self._call(
                f"deleting pod {namespace}/{name}", self._core.delete_namespaced_pod, name, namespace, **grace
            )
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def executor(self, namespace: str, pod: PodFacts) -> PodExecutor:
        return PodExecutor(
            self._core, namespace, pod.name, pod.container, self.endpoint, self.timeouts, self.cancelled
        )


def _event_time(event) -> str:
    moment = event.last_timestamp or event.event_time or event.first_timestamp
    return moment.isoformat() if moment is not None else ""


def _seconds(moment) -> float | None:
    """A time of the API's (the client parses it to an aware datetime) in seconds since the epoch."""
    return moment.timestamp() if moment is not None else None


def _node_facts(node) -> NodeFacts:
    conditions = (node.status.conditions or []) if node.status else []
    ready = next((c for c in conditions if c.type == "Ready"), None)
    return NodeFacts(
        name=node.metadata.name,
        labels=dict(node.metadata.labels or {}),
        allocatable=dict((node.status.allocatable or {}) if node.status else {}),
        ready=ready is not None and ready.status == "True",
        provider_id=(node.spec.provider_id or "") if node.spec else "",
        ready_status=(ready.status or "") if ready is not None else "",
        ready_changed_at=_seconds(ready.last_transition_time) if ready is not None else None,
        unschedulable=bool(node.spec.unschedulable) if node.spec else False,
    )


def _pod_facts(pod) -> PodFacts:
    status = pod.status
    conditions = (status.conditions or []) if status else []
    problems = []
    for container in (status.container_statuses or []) if status else []:
        state = container.state
        for stuck in (state.waiting, state.terminated) if state else ():
            if stuck is not None and stuck.reason not in (
                None,
                "ContainerCreating",
                "PodInitializing",
                "Completed",
            ):
                problems.append(
                    f"{container.name} {stuck.reason}" + (f": {stuck.message}" if stuck.message else "")
                )
    if status and status.reason:
        problems.append(f"pod {status.reason}" + (f": {status.message}" if status.message else ""))
    return PodFacts(
        name=pod.metadata.name,
        phase=(status.phase if status else None) or "Unknown",
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        container=pod.spec.containers[0].name,
        node_name=pod.spec.node_name,
        terminating=pod.metadata.deletion_timestamp is not None,
        problems=tuple(problems),
        annotations=dict(pod.metadata.annotations or {}),
        uid=pod.metadata.uid or "",
        namespace=pod.metadata.namespace or "",
        deleted_at=_seconds(pod.metadata.deletion_timestamp),
    )
