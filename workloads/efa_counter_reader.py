"""The EFA counter reader: a small DaemonSet on the GPU nodes that reads each node's EFA port
counters where the kernel shows them, in the host's network namespace.

A Ray worker pod runs in a network namespace of its own, where the RDMA core shows only compat
devices without port `hw_counters` (`training.metrics.efa_sysfs` has the kernel sources). The
reader runs with `hostNetwork: true`, as the EFA device plugin's DaemonSet does (aws/eks-charts,
stable/aws-efa-k8s-device-plugin/templates/daemonset.yaml), so the sysfs its container runtime
mounts is the host's and holds the full devices with their counters. It serves them on the
node's own address (`READER_PORT`) for the training job's per-step meter, and the TrainingRun
execs the same reader (`efa_sysfs.py print`) in it around each job, matched to each worker pod by
node name.

Pod Security `baseline` forbids host namespaces, so the reader has a namespace of its own, which
admits it (`privileged`); it asks for nothing else: no capability, no privilege escalation, a
read-only root, a non-root user (the RDMA core's counter files are world-readable: 0444, sysfs.c
`alloc_hw_stats_port`), no service account token. Its image is the Ray image, which the worker
pods already pulled onto the same nodes, and its program is `training/metrics/efa_sysfs.py`,
handed over as `python -c` source, so the reader and the readers of its answers share one file.
The kubelet expands `$(VAR)` and `$$` in a container's command (k8s.io/kubernetes
third_party/forked/golang/expansion/expand.go), so that source holds neither.

The reader stays up where the job needs it: the kubelet restarts a server that stops answering
(`livenessProbe`); a full node still admits it (`system-node-critical`, as the NVIDIA device plugin's
and the CloudWatch agent's charts set in their values.yaml; any namespace may use the class since
Kubernetes 1.17, kubernetes/kubernetes PR 76310, unless the cluster's ResourceQuota admission
configuration limits it); and the NVIDIA runtime hands it no GPU (`NO_GPU_ENV`), so a node whose
GPUs fail NVML's start still starts it.
"""

from __future__ import annotations

import copy
from pathlib import Path

from platform_contract import GPU_NODE_SELECTOR, GPU_TOLERATION, NO_GPU_ENV, PART_OF_LABELS
from training.metrics import efa_sysfs
from training.metrics.efa_sysfs import COUNTERS_URL_ENV

READER_NAME = "efa-counters"
READER_NAMESPACE = "efa-counters"
READER_LABELS = {"app.kubernetes.io/name": READER_NAME}
READER_SELECTOR = ",".join(f"{key}={value}" for key, value in READER_LABELS.items())
READER_CONTAINER = "reader"
# The reader's port on each GPU node's address; nothing else on an EKS GPU node listens there.
READER_PORT = 9478
NODE_IP_ENV = "NODE_IP"
# The node's address, from the downward API, so a pod can name its own node's reader.
NODE_IP = {"name": NODE_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
READER_SOURCE = Path(efa_sysfs.__file__).read_text(encoding="utf-8")
NOBODY = 65534
# The highest of the two priority classes every cluster has (Kubernetes, "Guaranteed Scheduling For
# Critical Add-On Pods"): the scheduler preempts other pods to place it on its node.
READER_PRIORITY_CLASS = "system-node-critical"
# What the kubelet's probes ask the server: the counters, as a worker pod asks them.
COUNTERS_GET = {"path": "/", "port": READER_PORT}
# A server that misses three answers in a row (30 s; it answers a GET from its own node at once) is
# restarted by the kubelet.
LIVENESS_PROBE = {"periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3}
# pulumi-kubernetes waits for a DaemonSet's rollout by default; the reader's pods start with the
# worker pods' image pull, which the TrainingRun waits for, so `pulumi up` does not wait here.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}


def counters_url_env() -> list[dict]:
    """The worker pods' environment naming their node's reader (`$(NODE_IP)` is expanded by the
    kubelet from the variable before it)."""
    return [
        copy.deepcopy(NODE_IP),
        {"name": COUNTERS_URL_ENV, "value": f"http://$({NODE_IP_ENV}):{READER_PORT}/"},
    ]


def counters_command() -> list[str]:
    """The reader's counter lines, once: what the TrainingRun execs in a reader pod."""
    return ["python", "-c", READER_SOURCE, "print", efa_sysfs.SYSFS_ROOT]


# Pod Security: `baseline` refuses host namespaces, so the namespace enforces `privileged`, and warns
# and audits at `baseline`: any pod but the reader admitted there is reported to whoever applies it
# (the policy pack's `namespace-pod-security-enforced` holds the stack's pods there to `hostNetwork`
# alone and to the reader's hardening: a DaemonSet, non-root, no capability, a read-only root, no
# privilege escalation, no service account token).
READER_POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/warn": "baseline",
    "pod-security.kubernetes.io/audit": "baseline",
}


def reader_namespace() -> dict:
    """The reader's own namespace: its host network namespace is all it needs beyond `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": READER_NAMESPACE, "labels": {**PART_OF_LABELS, **READER_POD_SECURITY_LABELS}},
    }


def reader_daemonset(image: str) -> dict:
    """One reader pod on each GPU node."""
    labels = {**PART_OF_LABELS, **READER_LABELS}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": READER_NAME,
            "namespace": READER_NAMESPACE,
            "labels": labels,
            "annotations": dict(SKIP_AWAIT),
        },
        "spec": {
            "selector": {"matchLabels": dict(READER_LABELS)},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "nodeSelector": dict(GPU_NODE_SELECTOR),
                    "tolerations": [copy.deepcopy(GPU_TOLERATION)],
                    "priorityClassName": READER_PRIORITY_CLASS,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": NOBODY,
                        "runAsGroup": NOBODY,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": READER_CONTAINER,
                            "image": image,
                            "command": [
                                "python",
                                "-c",
                                READER_SOURCE,
                                "serve",
                                f"$({NODE_IP_ENV})",
                                str(READER_PORT),
                            ],
                            "env": [copy.deepcopy(NODE_IP), dict(NO_GPU_ENV)],
                            # With hostNetwork the container's port is the node's.
                            "ports": [{"name": "counters", "containerPort": READER_PORT}],
                            "readinessProbe": {"httpGet": dict(COUNTERS_GET), "periodSeconds": 10},
                            "livenessProbe": {"httpGet": dict(COUNTERS_GET), **LIVENESS_PROBE},
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "64Mi"},
                                "limits": {"memory": "128Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "privileged": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }
