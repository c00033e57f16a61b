"""When the cluster counts as ready for the job, and the bounded waits until it is.

In the order of AWS's reference example, before anything is submitted:

1. every GPU node (`role=gpu-worker`) is Ready, advertises allocatable `nvidia.com/gpu` equal to
   the GPUs per node and `vpc.amazonaws.com/efa` of at least the EFA interfaces per node (the
   device plugins register them after the node joins), and carries `nvidia.com/gpu.present=true`
   (set by the EKS NVIDIA AMI); there are at least as many GPU nodes as Ray worker pods;
2. the RayCluster's head pod and all its worker pods are Ready and run the current spec: they carry
   the inputs' `run_spec_hash` in their spec-hash annotation. Right after `pulumi up` changes the
   RayCluster, the old pods are still Ready until KubeRay deletes them (`upgradeStrategy:
   Recreate`); pods of another spec, and terminating pods, do not count;
3. the head pod sees the code being deployed: `.code-hash` in the ConfigMap mount equals the
   inputs' code hash (the kubelet refreshes ConfigMap volumes lazily);
4. for a job on GPUs, what each worker pod runs on (`host_limit_problems`): the node's NVIDIA
   driver supports the CUDA major version the image's PyTorch was built for, and the locked-memory
   limit is unlimited or at least `MIN_MEMLOCK_KIB`, as EFA needs. Neither can be fixed from inside
   the pod: KubeRay replaces the image's entrypoint, and with it the AWS DLC's CUDA
   forward-compatibility shim (KubeRay v1.7.0 `BuildPod` sets the container's command), so the pod
   runs on the node's driver; and a container cannot raise its memlock limit, which comes from the
   node's container runtime (AWS EFA user guide, "Install the EFA software in a container"). The EKS
   AL2023 base runtime spec sets only RLIMIT_NOFILE (awslabs/amazon-eks-ami,
   nodeadm/internal/containerd/base-runtime-spec.json), so the GPU nodes' NodeConfig sets
   RLIMIT_MEMLOCK in it (`infra.resources.node_groups.CONTAINER_RLIMITS`); the check finds a node
   where that did not apply.

With `gpuNodesAfterTraining: release` a step 0 comes first: the GPU node group is scaled out to
`gpuNodeCount` (`gpu_node_group`), and step 1 then waits for the nodes to join.

The rules are pure functions over `NodeFacts`/`PodFacts`; the waits poll them until
they hold or the time is up, then fail naming each node or pod and what it lacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from platform_contract import EFA_RESOURCE, GPU_NODE_SELECTOR, GPU_PRESENT_LABEL, GPU_RESOURCE
from training.config.settings import switch_values
from workloads import manifests
from workloads.training_run.access.cluster_api import ClusterApi, NodeFacts, PodFacts, stdout_of_each_pod
from workloads.training_run.access.commands import COMMAND_TIMEOUT_S, Executor
from workloads.training_run.errors import TrainingRunError

GPU_NODE_LABEL_SELECTOR = ",".join(f"{key}={value}" for key, value in GPU_NODE_SELECTOR.items())
# The oldest Linux driver of each CUDA major version (NVIDIA CUDA Toolkit release notes, "CUDA Driver":
# 12.x needs >= 525.60.13, 13.x >= 580.65.06), for the fix a too-old driver is told.
MIN_DRIVER_OF_CUDA = {12: "525.60.13", 13: "580.65.06"}
# The lowest finite locked-memory limit (`ulimit -l`, KiB) a worker pod runs the job with. Without
# CAP_IPC_LOCK, which the workers drop, the kernel charges every memory registration with the EFA
# device to the process's RLIMIT_MEMLOCK (Linux drivers/infiniband/core/umem.c, `ib_umem_get`). What
# one NCCL rank registers in host memory: for each EFA endpoint aws-ofi-nccl opens (one per EFA
# device the rank uses, up to 4 per GPU on p5), libfabric's EFA provider's send and receive packet
# pools, one MTU-sized buffer (about 8 KiB) per queue entry, with queue depths in the thousands
# (ofiwg/libfabric prov/efa/src/rdm/efa_rdm_ep_fiops.c, `efa_rdm_ep_create_buffer_pools`); and,
# without GPUDirect RDMA (g5, g6), NCCL's host staging buffers of each network channel and peer
# (NCCL_BUFFSIZE, 4 MiB, per protocol), which aws-ofi-nccl registers too. Together a few hundred MiB;
# 64 MiB fails at the provider's first receive buffers (awslabs/awsome-distributed-ai issue 647). AWS
# names no number (its EFA guide asks for unlimited), so the floor is a conservative choice: 4 GiB,
# several times that sum, and far above the 64 KiB to 8 MiB that kernels and systemd give by default.
MIN_MEMLOCK_KIB = 4 * 1024 * 1024
# One worker pod's NVIDIA driver, the highest CUDA version that driver supports (nvidia-smi's header),
# the CUDA version the image's PyTorch was built for, and the locked-memory limit (KiB or unlimited).
HOST_LIMITS_SCRIPT = """\
echo "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
echo "driver_cuda $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -n 1 | cut -d' ' -f3)"
echo "runtime_cuda $(python -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)"
echo "memlock $(ulimit -l)"
"""


@dataclass(frozen=True)
class Pace:
    """How a wait polls: interval, clock and sleep (tests pass a fake clock)."""

    poll_interval_s: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def until(self, timeout_s: float, attempt: Callable[[], tuple[bool, Any]]) -> tuple[bool, Any]:
        """Call `attempt` until it returns (True, value) or the time is up: (False, last value)."""
        deadline = self.clock() + timeout_s
        while True:
            done, value = attempt()
            if done or self.clock() >= deadline:
                return done, value
            self.sleep(self.poll_interval_s)


@dataclass
class RayPods:
    """The RayCluster's pods a run uses, once Ready."""

    head: PodFacts
    workers: list[PodFacts]

    def identity(self) -> str:
        """Which pods these are, by name and UID: a pod deleted and created again, by a node roll or
        `kubectl delete pod`, gets a new UID even under the same name."""
        return " ".join(
            f"{pod.name}={pod.uid}" for pod in [self.head, *sorted(self.workers, key=lambda p: p.name)]
        )


# --- the rules ---------------------------------------------------------------------------------


def _quantity(value: str | None) -> int | None:
    """Extended resources are whole numbers; anything else counts as absent."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def gpu_node_problems(
    nodes: Sequence[NodeFacts], gpus_per_node: int, efa_per_node: int, worker_pods: int
) -> list[str]:
    """What keeps the GPU nodes from running the job, one line per problem (empty: ready)."""
    if not nodes:
        return [
            f"no node carries the label {GPU_NODE_LABEL_SELECTOR}: the GPU node group has not joined the cluster"
        ]
    problems = []
    if len(nodes) < worker_pods:
        problems.append(f"{len(nodes)} GPU nodes for {worker_pods} Ray worker pods (one worker pod per node)")
    for node in sorted(nodes, key=lambda node: node.name):
        missing = []
        if not node.ready:
            missing.append("the node is not Ready")
        gpus = _quantity(node.allocatable.get(GPU_RESOURCE))
        if gpus != gpus_per_node:
            missing.append(
                f"allocatable {GPU_RESOURCE} is {gpus if gpus is not None else 'absent'}, expected {gpus_per_node} "
                "(is the nvidia-device-plugin pod running on it?)"
            )
        efa = _quantity(node.allocatable.get(EFA_RESOURCE))
        if efa_per_node and (efa is None or efa < efa_per_node):
            missing.append(
                f"allocatable {EFA_RESOURCE} is {efa if efa is not None else 'absent'}, expected at least "
                f"{efa_per_node} (is the aws-efa-k8s-device-plugin pod running on it, and does its launch "
                "template attach an EFA interface?)"
            )
        if node.labels.get(GPU_PRESENT_LABEL) != "true":
            missing.append(f"label {GPU_PRESENT_LABEL}=true is missing (not the EKS NVIDIA AMI?)")
        problems += [f"node {node.name}: {reason}" for reason in missing]
    return problems


def runs_spec(pod: PodFacts, spec_hash: str) -> bool:
    """Whether KubeRay created the pod from the RayCluster spec of this hash."""
    return pod.annotations.get(manifests.SPEC_HASH_ANNOTATION) == spec_hash


def pods_waiting_for(
    heads: Sequence[PodFacts], workers: Sequence[PodFacts], worker_pods: int, spec_hash: str
) -> list[str]:
    """What the readiness wait still waits for (empty: one head and every worker are Ready on this spec)."""
    waiting = []
    if not any(pod.ready and runs_spec(pod, spec_hash) for pod in heads):
        waiting.append("the head pod" if heads else "a head pod (none exists yet)")
    ready_workers = sum(pod.ready and runs_spec(pod, spec_hash) for pod in workers)
    if ready_workers < worker_pods:
        waiting.append(f"{worker_pods - ready_workers} of {worker_pods} worker pods ({len(workers)} exist)")
    return waiting


def describe_pod(pod: PodFacts, events: Sequence[str], spec_hash: str) -> str:
    state = "Ready" if pod.ready else "not Ready"
    where = f" on {pod.node_name}" if pod.node_name else " (not scheduled)"
    lines = [f"{pod.name}: {pod.phase}, {state}{where}" + (" (terminating)" if pod.terminating else "")]
    if not runs_spec(pod, spec_hash):
        seen = pod.annotations.get(manifests.SPEC_HASH_ANNOTATION)
        lines.append(f"    runs RayCluster spec {seen or '(none recorded)'}, not {spec_hash}")
    lines += [f"    {problem}" for problem in pod.problems]
    lines += [f"    event {event}" for event in events]
    return "\n".join(lines)


# The training job's GPU switches and what each gives (`use_gpu`; the last one given wins).
GPU_SWITCHES = switch_values("use_gpu")


def uses_gpus(job_args: Sequence[str]) -> bool:
    """Whether the job trains on GPUs, as its last GPU switch says: the program always gives
    `--use-gpu` (`infra.config.training_settings.job_arguments`); without a switch the job's preset
    decides, which this side does not read, so no GPU is assumed."""
    switches = [GPU_SWITCHES[arg] for arg in job_args if arg in GPU_SWITCHES]
    return switches[-1] if switches else False


def host_limits_command() -> list[str]:
    return ["sh", "-c", HOST_LIMITS_SCRIPT]


@dataclass(frozen=True)
class HostLimits:
    """What `HOST_LIMITS_SCRIPT` read in one worker pod; "" where it read nothing."""

    driver: str
    driver_cuda: str
    runtime_cuda: str
    memlock: str

    @classmethod
    def parse(cls, stdout: str) -> HostLimits:
        fields = dict(line.partition(" ")[::2] for line in stdout.splitlines() if line.strip())
        return cls(
            *(fields.get(name, "").strip() for name in ("driver", "driver_cuda", "runtime_cuda", "memlock"))
        )


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def host_limit_problems(pod: str, limits: HostLimits) -> list[str]:
    """Why the worker pod's node cannot run the job, one line each (empty: it can, or nothing was read)."""
    problems = []
    driver, runtime = _major(limits.driver_cuda), _major(limits.runtime_cuda)
    if driver is not None and runtime is not None and driver < runtime:
        oldest = MIN_DRIVER_OF_CUDA.get(runtime)
        problems.append(
            f"{pod}: its node's NVIDIA driver {limits.driver} supports CUDA up to {limits.driver_cuda}, but the "
            f"image's PyTorch is built for CUDA {limits.runtime_cuda}"
            + (f", which needs driver {oldest} or later" if oldest else "")
            + " (KubeRay replaces the image's entrypoint and its CUDA compat shim). Fix: run the GPU nodes on an "
            "EKS AL2023 NVIDIA AMI release with a newer driver, or pick an image built for the node's CUDA"
        )
    if limits.memlock and limits.memlock != "unlimited" and _memlock_kib(limits) < MIN_MEMLOCK_KIB:
        problems.append(
            f"{pod}: the locked-memory limit is {limits.memlock} KiB, under the {MIN_MEMLOCK_KIB} KiB floor: EFA "
            "registers the memory it sends from and fails at the first collective with a small limit, and a "
            "container cannot raise it. Fix: the GPU nodes' NodeConfig did not apply: check "
            "/etc/containerd/base-runtime-spec.json on the node (its RLIMIT_MEMLOCK) and that the node group "
            "runs the current version of its launch template"
        )
    return problems


def _memlock_kib(limits: HostLimits) -> int:
    """The finite limit in KiB; 0 for what `ulimit -l` never prints (so it is refused, not guessed)."""
    return int(limits.memlock) if limits.memlock.isdigit() else 0


def _memlock_read(limits: HostLimits) -> str:
    """The limit as the log line shows it: a finite one is noted, since AWS's EFA guide asks for unlimited."""
    if not limits.memlock:
        return "not read"
    if limits.memlock == "unlimited":
        return "unlimited"
    return f"{limits.memlock} KiB (finite, at least the {MIN_MEMLOCK_KIB} KiB floor)"


def check_host_limits(workers: Sequence[PodFacts], executor_for: Callable[[PodFacts], Executor]) -> list[str]:
    """Stop, in one line, when a worker pod's node cannot run the job; else what was read, per pod."""
    listings = stdout_of_each_pod(
        workers, executor_for, host_limits_command(), "the driver and memlock limit"
    )
    read, problems = [], []
    for pod, stdout in listings.items():
        limits = HostLimits.parse(stdout)
        problems += host_limit_problems(pod, limits)
        read.append(
            f"{pod}: driver {limits.driver or 'not read'} (CUDA {limits.driver_cuda or '?'}), image CUDA "
            f"{limits.runtime_cuda or '?'}, memlock {_memlock_read(limits)}"
        )
    if problems:
        raise TrainingRunError("; ".join(problems))
    return read


def code_hash_command(code_dir: str) -> list[str]:
    return ["cat", str(PurePosixPath(code_dir) / manifests.CODE_HASH_FILE)]


# --- the waits -----------------------------------------------------------------------------------


def wait_for_gpu_nodes(
    cluster: ClusterApi,
    pace: Pace,
    timeout_s: float,
    gpus_per_node: int,
    efa_per_node: int,
    worker_pods: int,
    seen: Callable[[list[NodeFacts]], None],
) -> list[NodeFacts]:
    """The GPU nodes once they can run the job; `seen` is told each listing, Ready or not."""

    def attempt():
        nodes = cluster.list_nodes(GPU_NODE_LABEL_SELECTOR)
        seen(nodes)
        problems = gpu_node_problems(nodes, gpus_per_node, efa_per_node, worker_pods)
        return not problems, (nodes, problems)

    ready, (nodes, problems) = pace.until(timeout_s, attempt)
    if not ready:
        raise TrainingRunError(
            f"the GPU nodes cannot run the training job after {timeout_s / 60:.0f} min:\n"
            + "\n".join(f"  - {problem}" for problem in problems)
        )
    return nodes


def wait_for_pods(
    cluster: ClusterApi,
    pace: Pace,
    timeout_s: float,
    namespace: str,
    ray_cluster_name: str,
    worker_pods: int,
    spec_hash: str,
) -> RayPods:
    """One Ready head and every worker Ready, all created from the RayCluster spec of `spec_hash`."""
    head_selector = manifests.head_pod_selector(ray_cluster_name)
    worker_selector = manifests.worker_pod_selector(ray_cluster_name)

    def attempt():
        heads = [p for p in cluster.list_pods(namespace, head_selector) if not p.terminating]
        workers = [p for p in cluster.list_pods(namespace, worker_selector) if not p.terminating]
        waiting = pods_waiting_for(heads, workers, worker_pods, spec_hash)
        return not waiting, (heads, workers, waiting)

    ready, (heads, workers, waiting) = pace.until(timeout_s, attempt)
    if not ready:
        described = [
            describe_pod(pod, cluster.pod_events(namespace, pod.name), spec_hash)
            for pod in [*heads, *workers]
        ]
        stale = [pod.name for pod in [*heads, *workers] if not runs_spec(pod, spec_hash)]
        raise TrainingRunError(
            f"RayCluster {namespace}/{ray_cluster_name} is not ready after {timeout_s / 60:.0f} min: "
            f"waiting for {' and '.join(waiting)}\n"
            + ("\n".join(described) if described else "no pods exist: is the KubeRay operator running?")
            + (f"\n{_stale_pods_hint(namespace, ray_cluster_name)}" if stale else "")
        )
    return RayPods(
        next(pod for pod in heads if pod.ready and runs_spec(pod, spec_hash)),
        [pod for pod in workers if pod.ready and runs_spec(pod, spec_hash)],
    )


def _stale_pods_hint(namespace: str, ray_cluster_name: str) -> str:
    """KubeRay replaces pods of an older spec itself, except once right after its own upgrade."""
    return (
        "pods of another RayCluster spec are left: KubeRay (upgradeStrategy Recreate) replaces them on a "
        "spec change, but not when the operator was upgraded in between; delete them with "
        f"`kubectl -n {namespace} delete pod -l {manifests.RAY_CLUSTER_LABEL}={ray_cluster_name}` and run "
        "`pulumi up` again"
    )


def wait_for_code(
    head: Executor, head_name: str, pace: Pace, timeout_s: float, code_dir: str, code_hash: str
) -> None:
    """The ConfigMap mount updates lazily: submit only once the head sees this code."""
    command = code_hash_command(code_dir)

    def attempt():
        result = head.run(command, COMMAND_TIMEOUT_S)
        seen = result.stdout.strip() if result.returncode == 0 else None
        return seen == code_hash, (seen, result)

    synced, (seen, result) = pace.until(timeout_s, attempt)
    if not synced:
        found = f"code hash {seen}" if seen is not None else f"no code hash ({result.output or 'no output'})"
        raise TrainingRunError(
            f"head pod {head_name} sees {found} in {command[1]}, not {code_hash}, after "
            f"{timeout_s / 60:.0f} min: the training-code ConfigMap has not reached the pod "
            "(is it mounted at that path? a container restart keeps the pod and its volume as they are; "
            "deleting the head pod makes KubeRay create it afresh with the current ConfigMap)"
        )
