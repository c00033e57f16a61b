"""The EFA counter reader: a `hostNetwork` DaemonSet on the GPU nodes that serves each node's EFA
counters, the one place where a pod sees them (`training.metrics.efa_sysfs` has the kernel's sources).

Its program really runs here: `efa_sysfs.py` as the DaemonSet starts it (`python -c <source> serve`,
the command expanded by the kubelet's rules) over a fake node sysfs in the host's view, read over
HTTP as the worker pods' meter reads it, and `print` as the TrainingRun's exec runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from platform_contract import GPU_NODE_SELECTOR, GPU_TOLERATION, NO_GPU_ENV
from tests.harness.counter_reader import (
    IMAGE,
    free_port,
    kubelet_env,
    kubelet_expand,
    reader_container,
    running_reader,
)
from tests.harness.fake_efa_sysfs import FakeEfaSysfs
from training.metrics.efa_sysfs import COUNTERS_URL_ENV, SYSFS_ROOT, read_counters, read_moved_bytes
from workloads import efa_counter_reader, manifests
from workloads.efa_counter_reader import READER_PORT, READER_SOURCE, counters_command, reader_daemonset

NODE_FIELDS = {"status.hostIP": "10.0.0.7"}  # what the downward API gives a pod on that node


def reader_pod_spec() -> dict:
    return reader_daemonset(IMAGE)["spec"]["template"]["spec"]


def test_the_reader_runs_in_the_hosts_network_namespace_on_every_gpu_node_with_nothing_else():
    """`hostNetwork` is what makes the kernel show the full devices; nothing beyond it is asked for."""
    spec = reader_pod_spec()
    assert spec["hostNetwork"] is True and spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == GPU_NODE_SELECTOR and spec["tolerations"] == [GPU_TOLERATION]
    assert spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "volumes" not in spec and "volumeMounts" not in container  # no hostPath: sysfs is the runtime's
    assert container["command"][:3] == ["python", "-c", READER_SOURCE]
    assert container["image"] == IMAGE  # the Ray image, already pulled onto the node by the worker pod


def test_the_reader_stays_up_on_a_full_node_and_is_restarted_when_it_stops_answering():
    """A node agent's priority (the scheduler preempts other pods for it), a liveness probe on the
    port the job reads, the readiness probe the TrainingRun waits on, and no GPU from the runtime."""
    spec = reader_pod_spec()
    assert spec["priorityClassName"] == "system-node-critical"
    (container,) = spec["containers"]
    get = {"path": "/", "port": READER_PORT}
    assert container["readinessProbe"] == {"httpGet": get, "periodSeconds": 10}
    liveness = container["livenessProbe"]
    assert liveness["httpGet"] == get
    assert liveness["failureThreshold"] * liveness["periodSeconds"] <= 60  # restarted within a minute
    assert NO_GPU_ENV in container["env"]


def test_the_kubelet_hands_the_reader_its_source_unchanged_and_its_node_address():
    """The kubelet expands `$(VAR)` and `$$` in the command: the program the container runs is
    `READER_SOURCE` byte for byte, and the address it serves on is its node's."""
    container = reader_container()
    env = kubelet_env(container["env"], NODE_FIELDS)
    assert env == {"NODE_IP": "10.0.0.7", "NVIDIA_VISIBLE_DEVICES": "void"}
    command = [kubelet_expand(arg, env) for arg in container["command"]]
    assert command[2].encode() == READER_SOURCE.encode()
    assert command[:2] == ["python", "-c"] and command[3:] == ["serve", "10.0.0.7", str(READER_PORT)]


def test_the_expansion_check_catches_a_source_the_kubelet_would_change():
    """The expansion rules the check applies (Kubernetes' expand_test.go cases): a `$$` or a
    `$(VAR)` of a defined variable in the source would reach the container changed."""
    env = {"NODE_IP": "10.0.0.7"}
    assert kubelet_expand("$(NODE_IP):$(PORT)", env) == "10.0.0.7:$(PORT)"  # undefined: as written
    assert kubelet_expand("$$(NODE_IP) $$$(NODE_IP) $$", env) == "$(NODE_IP) $10.0.0.7 $"
    assert kubelet_expand("$(NODE_IP $NODE_IP ${NODE_IP} $", env) == "$(NODE_IP $NODE_IP ${NODE_IP} $"
    for addition in ("print('$$')", "print('$(NODE_IP)')"):
        source = f"{READER_SOURCE}{addition}\n"
        assert kubelet_expand(source, env) != source


def test_the_reader_has_a_namespace_of_its_own_which_admits_host_namespaces():
    """Pod Security `baseline` (the Ray namespace's) forbids `hostNetwork`."""
    labels = efa_counter_reader.reader_namespace()["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert manifests.POD_SECURITY_LABELS["pod-security.kubernetes.io/enforce"] == "baseline"
    assert reader_daemonset(IMAGE)["metadata"]["namespace"] != "ray-train"


def test_worker_pods_are_told_their_own_nodes_reader():
    """The node's address comes from the downward API; the kubelet expands `$(NODE_IP)` only from a
    variable defined before it in the same list."""
    env = efa_counter_reader.counters_url_env()
    assert env[0] == {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
    assert env[1] == {"name": COUNTERS_URL_ENV, "value": f"http://$(NODE_IP):{READER_PORT}/"}
    assert kubelet_env(env, NODE_FIELDS)[COUNTERS_URL_ENV] == f"http://10.0.0.7:{READER_PORT}/"


@pytest.fixture
def node(tmp_path: Path) -> FakeEfaSysfs:
    sysfs = FakeEfaSysfs(tmp_path / "infiniband")
    FakeEfaSysfs(tmp_path / "infiniband", device="rdmap32s27").add({"tx_bytes": 5})
    return sysfs


def test_the_reader_serves_the_nodes_counters_as_the_meter_reads_them(node: FakeEfaSysfs):
    """The DaemonSet's command, run here over the host's view of a node; the meter's HTTP read gives
    what the sysfs read gives, and follows the counters as they move."""
    command = reader_daemonset(IMAGE)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[4:] == ["$(NODE_IP)", str(READER_PORT)]
    with running_reader(node.root, "127.0.0.1") as reader:
        assert read_counters(reader.url) == read_counters(str(node.root)) != {}
        before = read_moved_bytes(reader.url)["rdmap16s27/1"]
        node.add({"tx_bytes": 1000, "rx_bytes": 24})
        assert read_moved_bytes(reader.url)["rdmap16s27/1"] == before + 1024


def test_the_trainingruns_exec_prints_the_same_counters(node: FakeEfaSysfs):
    argv = counters_command()
    assert argv[-1] == SYSFS_ROOT
    done = subprocess.run(
        [sys.executable, *argv[1:-1], str(node.root)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "rdmap16s27/ports/1/hw_counters/tx_bytes " in done.stdout
    assert len(done.stdout.splitlines()) == 2 * len(node.counters)  # both devices of the node


def test_a_pods_own_sysfs_and_a_silent_server_read_as_no_counters(node: FakeEfaSysfs):
    """What a worker pod sees of its node (compat devices, no `hw_counters`), and a reader that does
    not answer, both read as no counters: the meter then stays off rather than reporting zero."""
    assert read_counters(str(node.pod_view)) == {}
    assert (node.pod_view / "rdmap16s27" / "ports" / "1" / "state").is_file()
    assert read_counters(f"http://127.0.0.1:{free_port('127.0.0.1')}/") == {}
