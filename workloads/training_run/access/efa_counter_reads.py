"""Each worker node's EFA counters, read by exec in the EFA counter reader pod on its node.

A worker pod cannot see them (its network namespace shows compat devices without port counters:
`training.metrics.efa_sysfs`), so they are read in the reader pod of the worker pod's node
(`workloads.efa_counter_reader`, `hostNetwork`), matched by node name. A node whose counters cannot
be read is named with why; `verdicts.efa_counters` judges what was read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from training.metrics.efa_sysfs import PortCounters, parse_counters
from workloads.efa_counter_reader import READER_NAME, READER_NAMESPACE, READER_SELECTOR, counters_command
from workloads.training_run.access.cluster_api import ClusterApi, PodFacts
from workloads.training_run.access.commands import COMMAND_TIMEOUT_S, CommandTimeout, Executor
from workloads.training_run.errors import ApiRefused, ExecStreamCut, PodGone

# Per worker pod: its node's counters, or why they could not be read.
Readings = dict[str, PortCounters | str]


def reader_pods(cluster: ClusterApi) -> dict[str, PodFacts]:
    """The reader pod to exec in on each node, by node name: a Ready one, else one whose container
    runs. The exec'd `print` reads sysfs itself, so it works while the pod's server is not Ready
    (wedged, or still starting)."""
    found: dict[str, PodFacts] = {}
    for pod in cluster.list_pods(READER_NAMESPACE, READER_SELECTOR):
        running = pod.phase == "Running" and not pod.problems and not pod.terminating
        if pod.node_name and running and (pod.ready or pod.node_name not in found):
            found[pod.node_name] = pod
    return found


def _read_one(
    worker: PodFacts, readers: Mapping[str, PodFacts], executor_for: Callable[[PodFacts], Executor]
) -> PortCounters | str:
    """One worker pod's node's counters, read by exec in its node's reader pod; or why not."""
    reader = readers.get(worker.node_name or "")
    if reader is None:
        return (
            f"no running {READER_NAME} pod on node {worker.node_name} "
            f"(`kubectl -n {READER_NAMESPACE} get pods -o wide`)"
        )
    try:
        result = executor_for(reader).run(counters_command(), COMMAND_TIMEOUT_S)
    except (PodGone, ExecStreamCut, CommandTimeout, ApiRefused) as error:
        return f"reading them in {READER_NAMESPACE}/{reader.name} failed: {error}"
    if result.returncode != 0:
        return (
            f"reading them in {READER_NAMESPACE}/{reader.name} failed (exit {result.returncode}): "
            f"{result.output[-300:]}"
        )
    return parse_counters(result.stdout)


def read_counters(
    cluster: ClusterApi, workers: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor]
) -> Readings:
    """Each worker pod's node's EFA port counters now, read by its node's reader pod; or why not."""
    readers = reader_pods(cluster)
    return {worker.name: _read_one(worker, readers, executor_for) for worker in workers}
