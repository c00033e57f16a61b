"""Local stand-ins for what the TrainingRun provider talks to: the EKS API, STS, the Kubernetes API
server of the cluster (TLS, REST and exec over websockets) and the Ray dashboard of the head pod.

Each models the real behaviour the provider depends on, and where that is documented:

- EKS `DescribeCluster` (REST-JSON, `GET /clusters/<name>`; AWS EKS API reference): the cluster's
  `endpoint` and base64 `certificateAuthority.data`; an unknown name answers 404 with
  `x-amzn-ErrorType: ResourceNotFoundException`. STS `GetCallerIdentity`/`AssumeRole` (query protocol,
  form-encoded POST, XML answers; AWS STS API reference). The access key id of each request's SigV4
  `Authorization` header is recorded, so tests see which identity the provider used. boto3 is pointed
  here with `AWS_ENDPOINT_URL_EKS` / `_STS` / `_EC2` (botocore's service-specific endpoints).
- EC2 `DescribeInstances` (query protocol, XML; EC2 API reference): each GPU node's instance with its
  `launchTime`, named by the node's `spec.providerID` in an `instance-id` filter.
- EKS `DescribeNodegroup` (`GET /clusters/<c>/node-groups/<ng>`) and `UpdateNodegroupConfig` (`POST
  /clusters/<c>/node-groups/<ng>/update-config`), shapes as in the EKS API reference (botocore's
  `eks` model): a `FakeNodeGroup` answers its `status`, `scalingConfig` and `health.issues`; an update
  is answered with an `update` (`type` ConfigUpdate, `params` DesiredSize, `createdAt` in epoch
  seconds, rest-json's timestamp form) and leaves the group UPDATING for the next describe; EKS refuses
  a desired size above the maximum (InvalidParameterException) and an update of a group that is
  neither ACTIVE nor DEGRADED (ResourceInUseException, "Nodegroup cannot be updated as it is currently
  not in Active State", aws/containers-roadmap#2204); a DEGRADED group takes a resize, and only a
  scale-out that succeeds makes it ACTIVE again (aws/containers-roadmap#2326). In the cluster: a
  scale-down removes the nodes at once (EKS drains them, forcibly after 5 minutes: EKS user guide,
  "Delete a managed node group"), and KubeRay's replacement for each evicted worker pod is Pending,
  without a node; after a scale-out the nodes join only after the node list has been read
  `join_after_lists` times (a node boots and registers in minutes, never at once), each with its Ray
  worker pod Ready on it under a new UID. A scale-out meeting `fail_scale_out` (an EKS health issue,
  e.g. AsgInstanceLaunchFailures of InsufficientInstanceCapacity) launches nothing and leaves the group
  DEGRADED with that issue.
- The Kubernetes API server over TLS with a self-signed certificate whose CA is what DescribeCluster
  returns. Requests need `Authorization: Bearer k8s-aws-v1.<base64url presigned STS GetCallerIdentity
  URL>` signed over the `x-k8s-aws-id` header (the aws-iam-authenticator token format EKS accepts);
  otherwise 401 with a `metav1.Status` body, as the API server answers. REST: list nodes, pods
  (label selectors), events (field selector), get a RayCluster custom object.
- Exec (`GET .../pods/<pod>/exec?command=...`, upgraded to a websocket; Kubernetes "remotecommand"
  protocols `v5.channel.k8s.io` / `v4.channel.k8s.io`): binary frames whose first byte is the channel
  (1 stdout, 2 stderr, 3 error); after the command ends the server writes one `metav1.Status` on
  channel 3 (`Success`, or `Failure` with reason `NonZeroExitCode` and an `ExitCode` cause) and closes.
  The kubernetes Python client offers `v5,v4` and reads exactly this (kubernetes/stream/ws_client.py).
- The Ray Jobs REST API of the dashboard (`GET /api/jobs/`, `/api/jobs/<id>`, `/api/jobs/<id>/logs`;
  Ray docs "Ray Jobs REST API"): job records with `submission_id`, `job_id`, `status`, `message`, and
  `metadata`, the string map `ray job submit --metadata-json` attached (Ray's `JobDetails.metadata`).
  Behind Ray's token authentication, as the RayCluster runs it (`FakeRayDashboard.token`), checked as
  Ray 2.58 checks it (ray/_private/authentication/http_token_authentication.py,
  `get_token_auth_middleware`); the head pod's environment carries the token as KubeRay sets it.
  Every pod object has a `metadata.uid`, new for each pod the API server creates, as Kubernetes does.
- A worker node's EFA port counters (`FakeEfaSysfs`), as the EFA kernel driver exposes them through
  the RDMA core's sysfs (amzn/amzn-drivers kernel/linux/efa/src/efa_verbs.c, `EFA_DEFINE_PORT_STATS`;
  the RDMA core prints each as `%llu\n`): `<device>/ports/1/hw_counters/<name>`, one decimal number
  per file, growing while the job's traffic goes through the port. They belong to the node, and only
  the host's network namespace sees them: a pod on the pod network (a Ray worker) sees a compat copy
  of the device whose port has attributes but no `hw_counters` (Linux drivers/infiniband/core/device.c
  `add_one_compat_dev`; sysfs.c `setup_port` adds `hw_counters` only `if (port_num && is_full_dev)`),
  while a `hostNetwork` pod (the EFA counter reader, `reader_pod`) sees the full device. A scripted job
  adds its `efa_traffic` to every worker node once submitted (a `stuck` device's counters stay put).
- NCCL's own log files (`NCCL_DEBUG_FILE`, one per process, line-buffered; NCCL src/debug.cc): a
  scripted job with `nccl_lines_of` writes them into each worker pod's `/tmp/ray` when submitted,
  from the lines of a fixture job's processes on that pod, as the real processes would while running.

Fault switches model what went wrong in the field: `unauthorized` (401 for every request, as for an
identity without an EKS access entry), `expired_keys` (401 for a token signed with those access keys:
EKS checks each token by calling STS, which refuses expired session credentials), `refuse` (an answer
instead of the request's: `too_many_requests` is what API priority and fairness sends when it sheds load,
apiserver/pkg/server/filters/priority-and-fairness.go: 429, `Retry-After`, a plain-text body from Go's
`http.Error`; it exempts long-running requests such as exec, so it only ever refuses REST calls here;
`status_reply` is a `metav1.Status` error as the API server writes it, e.g. 500 "error dialing backend"
when it cannot reach the kubelet behind an exec, or 400 while the container is not running), an exec
in a pod that is not in `pods` (404 `pods "<name>" not found`: the API server looks the pod up first), `cut_exec` (the exec stream of matching commands ends after some
output without the Status frame: with a websocket close frame, or by the connection dropping), `SilentEndpoint` (accepts TCP connections and never answers, like an
endpoint whose packets are dropped). Pods that never become Ready are just pod objects that say so.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from platform_contract import PART_OF_LABELS
from tests.harness.counter_reader import free_port, kubelet_env, kubelet_expand, reader_container
from tests.harness.ray_head import token_auth_env
from workloads.efa_counter_reader import READER_CONTAINER, READER_LABELS, READER_NAMESPACE, READER_PORT
from workloads.training_run.readiness import host_limits_command

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, section 1.3
STDOUT, STDERR, ERROR = 1, 2, 3


def self_signed_certificate(folder: Path) -> tuple[Path, Path, bytes]:
    """(cert file, key file, PEM) for 127.0.0.1/localhost, as EKS's CA-signed serving cert stands in."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = folder / "apiserver.crt", folder / "apiserver.key"
    cert_file.write_bytes(pem)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file, pem


# --- Kubernetes objects as the API server serialises them -----------------------------------------


def node(
    name: str,
    gpus: str | None = "4",
    efa: str | None = "1",
    present: bool = True,
    ready: bool = True,
    instance_id: str = "i-0f0f0f0f0f0f0f0f0",
) -> dict:
    """A GPU node as the API server serves it; `spec.providerID` names its EC2 instance as EKS sets it
    (`aws:///<zone>/<instance id>`)."""
    allocatable = {"cpu": "47810m", "memory": "187655916Ki"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    if efa is not None:
        allocatable["vpc.amazonaws.com/efa"] = efa
    labels = {"role": "gpu-worker", "node.kubernetes.io/instance-type": "g6.12xlarge"}
    if present:
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": f"aws:///us-east-2a/{instance_id}"},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    node_type: str,
    ready: bool = True,
    phase: str = "Running",
    node_name: str | None = "node-a",
    uid: str | None = None,
) -> dict:
    container = "ray-head" if node_type == "head" else "ray-worker"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "namespace": "ray-train",
            "labels": {"ray.io/cluster": "ray-train", "ray.io/node-type": node_type},
        },
        "spec": {"containers": [{"name": container, "image": "ray"}], "nodeName": node_name},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": container,
                    "image": "ray",
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "state": {"running": {}} if ready else {"waiting": {"reason": "ContainerCreating"}},
                }
            ],
        },
    }


def reader_pod(name: str, node_name: str) -> dict:
    """An EFA counter reader pod of the DaemonSet, on `node_name` (`workloads.efa_counter_reader`).
    Its status is the kubelet's view of the node's `FakeReaderNode`, filled in whenever the pod is
    listed (`FakeKubeApi.readers`)."""
    labels = {**PART_OF_LABELS, **READER_LABELS}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "namespace": READER_NAMESPACE,
            "labels": labels,
        },
        "spec": {
            "containers": [{"name": READER_CONTAINER, "image": "ray"}],
            "nodeName": node_name,
            "hostNetwork": True,
        },
        "status": {"phase": "Pending"},
    }


def _selected(labels: dict, selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all((labels or {}).get(key) == value for key, value in wanted.items())


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _valid_eks_token(header: str, cluster_name: str) -> bool:
    """The shape EKS checks before asking STS: a presigned GetCallerIdentity bound to the cluster."""
    prefix = "Bearer k8s-aws-v1."
    if not header.startswith(prefix):
        return False
    body = header[len(prefix) :]
    try:
        url = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except ValueError:
        return False
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    return (
        query.get("Action") == ["GetCallerIdentity"]
        and "x-k8s-aws-id" in query.get("X-Amz-SignedHeaders", [""])[0].split(";")
        and bool(cluster_name)
    )


def _token_access_key(header: str) -> str:
    """The access key id the token's presigned URL was signed with (`X-Amz-Credential`)."""
    body = header.removeprefix("Bearer k8s-aws-v1.")
    try:
        url = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except ValueError:
        return ""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    return query.get("X-Amz-Credential", [""])[0].split("/")[0]


# --- exec ---------------------------------------------------------------------------------------------


def serve_on_loopback(
    handlers: dict[str, Callable[[BaseHTTPRequestHandler], None]], tls: ssl.SSLContext | None = None
) -> ThreadingHTTPServer:
    """An HTTP/1.1 server on 127.0.0.1 (a free port) that answers each method with its handler,
    serving from a daemon thread until `stop_server`."""
    methods = {f"do_{method}": (lambda self, serve=serve: serve(self)) for method, serve in handlers.items()}
    handler = type(
        "Handler",
        (BaseHTTPRequestHandler,),
        {"protocol_version": "HTTP/1.1", "log_message": lambda self, *args: None, **methods},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def stop_server(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


@dataclass
class ExecReply:
    """What a command in a pod produced."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    not_started: str | None = None  # the runtime could not start the command: why (see `start_failure`)


ExecHandler = Callable[[str, str, list[str]], ExecReply]  # (pod, container, argv)


def _frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One unmasked server-to-client websocket frame (RFC 6455, section 5.2)."""
    header = bytes([0x80 | opcode])
    if len(payload) < 126:
        header += bytes([len(payload)])
    elif len(payload) < 1 << 16:
        header += bytes([126]) + len(payload).to_bytes(2, "big")
    else:
        header += bytes([127]) + len(payload).to_bytes(8, "big")
    return header + payload


def start_failure(why: str) -> dict:
    """The Status the kubelet writes when the runtime cannot start the command (a missing
    executable): an internal error, no exit code, nothing on stderr (kubelet cri streaming `ServeExec`
    writes `apierrors.NewInternalError(err)`; containerd words a missing binary as below)."""
    message = f"Internal error occurred: error executing command in container: {why}"
    return {
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    }


def exit_status(exit_code: int, argv: list[str]) -> dict:
    """The Status the kubelet writes on the error channel when the command ends."""
    if exit_code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {argv}: exit code {exit_code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
    }


@dataclass(frozen=True)
class Refusal:
    """An HTTP answer given instead of the request's (a handshake refused before any upgrade)."""

    code: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def too_many_requests(retry_after: int = 1) -> Refusal:
    """API priority and fairness rejecting a request (`tooManyRequests` in priority-and-fairness.go)."""
    return Refusal(
        429,
        b"Too many requests, please try again later.\n",
        "text/plain; charset=utf-8",
        (("Retry-After", str(retry_after)), ("X-Content-Type-Options", "nosniff")),
    )


def status_reply(code: int, reason: str, message: str) -> Refusal:
    """A `metav1.Status` error, as the API server answers a request it cannot serve."""
    return Refusal(code, json.dumps(_status(code, reason, message)).encode(), "application/json")


Refuse = Callable[[str, "list[str] | None"], Refusal | None]  # (URL path, exec argv or None) -> answer


@dataclass
class FakeKubeApi:
    """The API server; `start()` serves it over TLS on 127.0.0.1, `endpoint` is its https URL."""

    folder: Path
    exec_handler: ExecHandler
    cluster_name: str = "eks-ray-train"
    nodes: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    ray_clusters: dict[str, dict] = field(default_factory=dict)
    subprotocol: str = "v5.channel.k8s.io"
    unauthorized: bool = False
    expired_keys: set[str] = field(default_factory=set)
    refuse: Refuse = lambda path, argv: None
    cut_exec: Callable[[str, list[str]], int | None] = lambda pod_name, argv: None  # stdout bytes kept
    cut_closes_cleanly: bool = False  # a websocket close frame ends the cut stream, else the TCP connection
    # A command that is still running in the pod: the stream is open, no frame comes until `stop()`
    # (as a Jobs API call behind a dashboard that does not answer would be).
    stall_exec: Callable[[str, list[str]], bool] = lambda pod_name, argv: False
    stalled: threading.Event = field(default_factory=threading.Event)  # set once a stalled exec began
    requests: list[str] = field(default_factory=list)
    execs: list[tuple[str, list[str]]] = field(default_factory=list)
    # Nodes on their way in after a scale-out: [node lists left before it joins, node, its worker pod].
    joining: list[list] = field(default_factory=list)
    # Reader pod name -> its container on its node: the pod's status is read from it when listed.
    readers: dict[str, FakeReaderNode] = field(default_factory=dict)

    def start(self) -> FakeKubeApi:
        cert_file, key_file, self.ca_pem = self_signed_certificate(self.folder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._released = threading.Event()
        self.server = serve_on_loopback({"GET": self._serve}, tls=context)
        self.endpoint = f"https://127.0.0.1:{self.server.server_address[1]}"
        return self

    def stop(self) -> None:
        self._released.set()
        stop_server(self.server)

    def _json(self, handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlparse(handler.path)
        query = urllib.parse.parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        self.requests.append(url.path)
        authorization = handler.headers.get("Authorization", "")
        if (
            self.unauthorized
            or not _valid_eks_token(authorization, self.cluster_name)
            or _token_access_key(authorization) in self.expired_keys
        ):
            return self._json(handler, 401, _status(401, "Unauthorized", "Unauthorized"))
        is_exec = len(parts) == 7 and parts[4] == "pods" and parts[6] == "exec"
        refusal = self.refuse(url.path, query.get("command", []) if is_exec else None)
        if refusal is not None:
            return self._refuse(handler, refusal)
        selector = query.get("labelSelector", [""])[0]
        if parts == ["api", "v1", "nodes"]:
            self._join_nodes()
            items = [n for n in self.nodes if _selected(n["metadata"]["labels"], selector)]
            return self._json(
                handler, 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
            items = [
                self._live(p)
                for p in self.pods
                if p["metadata"]["namespace"] == parts[3] and _selected(p["metadata"]["labels"], selector)
            ]
            return self._json(
                handler, 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "events":
            wanted = dict(t.split("=", 1) for t in query.get("fieldSelector", [""])[0].split(",") if t)
            items = [
                e for e in self.events if e["involvedObject"]["name"] == wanted.get("involvedObject.name")
            ]
            return self._json(
                handler, 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        if (
            parts[:5] == ["apis", "ray.io", "v1", "namespaces", parts[4] if len(parts) > 4 else ""]
            and len(parts) == 7
        ):
            body = self.ray_clusters.get(parts[6])
            if body is None:
                return self._json(
                    handler, 404, _status(404, "NotFound", f'rayclusters.ray.io "{parts[6]}" not found')
                )
            return self._json(handler, 200, body)
        if len(parts) == 7 and parts[4] == "pods" and parts[6] == "exec":
            return self._exec(
                handler, parts[3], parts[5], query.get("container", [""])[0], query.get("command", [])
            )
        return self._json(
            handler, 404, _status(404, "NotFound", "the server could not find the requested resource")
        )

    def _live(self, pod_object: dict) -> dict:
        """A reader pod with the status its node's kubelet reports now; any other pod as it is."""
        reader = self.readers.get(pod_object["metadata"]["name"])
        return pod_object if reader is None else {**pod_object, "status": reader.pod_status()}

    def _join_nodes(self) -> None:
        """One more node list read: nodes whose turn came join, their worker pods scheduled and Ready."""
        for entry in self.joining:
            entry[0] -= 1
        for _, node_object, worker in [entry for entry in self.joining if entry[0] <= 0]:
            self.nodes.append(node_object)
            self.set_worker(worker, node_object["metadata"]["name"])
        self.joining = [entry for entry in self.joining if entry[0] > 0]

    def set_worker(self, name: str, node_name: str | None) -> None:
        """KubeRay's worker pod `name` created anew: Running and Ready on `node_name`, or Pending
        without a node (the scheduler finds no GPU node); a new pod object gets a new UID."""
        index = next(i for i, p in enumerate(self.pods) if p["metadata"]["name"] == name)
        old = self.pods[index]
        fresh = pod(
            name,
            "worker",
            ready=node_name is not None,
            phase="Running" if node_name else "Pending",
            node_name=node_name,
            uid=str(uuid.uuid4()),
        )
        fresh["metadata"]["annotations"] = dict(old["metadata"].get("annotations") or {})
        self.pods[index] = fresh

    def _refuse(self, handler: BaseHTTPRequestHandler, refusal: Refusal) -> None:
        handler.send_response(refusal.code)
        handler.send_header("Content-Type", refusal.content_type)
        handler.send_header("Content-Length", str(len(refusal.body)))
        for key, value in refusal.headers:
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(refusal.body)

    def _exec(
        self, handler: BaseHTTPRequestHandler, namespace: str, pod_name: str, container: str, argv: list[str]
    ) -> None:
        # The API server looks the pod up in the request's namespace first.
        if not any(
            p["metadata"]["name"] == pod_name and p["metadata"]["namespace"] == namespace for p in self.pods
        ):
            return self._refuse(handler, status_reply(404, "NotFound", f'pods "{pod_name}" not found'))
        reader = self.readers.get(pod_name)
        if reader is not None and not reader.running:
            # The kubelet has no running container to exec in (kubectl prints "unable to upgrade
            # connection: container not found": kubernetes/kubernetes#17460, kubernetes/website#40775).
            return self._refuse(
                handler, status_reply(500, "InternalError", f'container not found ("{READER_CONTAINER}")')
            )
        offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if handler.headers.get("Upgrade", "").lower() != "websocket" or self.subprotocol not in offered:
            return self._json(handler, 400, _status(400, "BadRequest", "exec needs a websocket upgrade"))
        accept = base64.b64encode(
            hashlib.sha1((handler.headers["Sec-WebSocket-Key"] + WEBSOCKET_GUID).encode()).digest()
        ).decode()
        handler.send_response(101, "Switching Protocols")
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header("Sec-WebSocket-Accept", accept)
        handler.send_header("Sec-WebSocket-Protocol", self.subprotocol)
        handler.end_headers()
        self.execs.append((pod_name, argv))
        if self.stall_exec(pod_name, argv):
            handler.wfile.flush()
            self.stalled.set()
            self._released.wait()
            return
        reply = self.exec_handler(pod_name, container, argv)
        out = handler.wfile
        keep = self.cut_exec(pod_name, argv)
        stdout = reply.stdout.encode()
        if keep is not None:
            out.write(_frame(bytes([STDOUT]) + stdout[:keep]))
            if self.cut_closes_cleanly:  # the API server lost the kubelet's stream and closed ours
                out.write(_frame((1000).to_bytes(2, "big"), opcode=0x8))
            out.flush()
            handler.close_connection = True
            if not self.cut_closes_cleanly:
                handler.connection.shutdown(socket.SHUT_RDWR)  # the connection itself dropped
            return
        for channel, data in ((STDOUT, stdout), (STDERR, reply.stderr.encode())):
            for start in range(0, len(data), 32 * 1024):  # long output arrives in several frames
                out.write(_frame(bytes([channel]) + data[start : start + 32 * 1024]))
        status = start_failure(reply.not_started) if reply.not_started else exit_status(reply.exit_code, argv)
        out.write(_frame(bytes([ERROR]) + json.dumps(status).encode()))
        if self.subprotocol == "v5.channel.k8s.io":
            out.write(_frame(bytes([255, STDOUT])) + _frame(bytes([255, STDERR])))
        out.write(_frame((1000).to_bytes(2, "big"), opcode=0x8))
        out.flush()
        handler.close_connection = True


class SilentEndpoint:
    """Accepts TCP connections (the kernel's backlog does) and never answers: a black-holed endpoint."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.endpoint = f"https://127.0.0.1:{self.socket.getsockname()[1]}"

    def stop(self) -> None:
        self.socket.close()


# --- EKS and STS ---------------------------------------------------------------------------------------


def insufficient_capacity(instance_type: str = "g6.12xlarge", zone: str = "us-east-2a") -> dict:
    """The health issue of a scale-out EC2 had no capacity for, as EKS lists it (EKS API `Issue`)."""
    return {
        "code": "AsgInstanceLaunchFailures",
        "message": f"Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
        f"sufficient {instance_type} capacity in the Availability Zone you requested ({zone}). Launching EC2 instance failed.",
        "resourceIds": ["eks-gpu-20260511-asg"],
    }


@dataclass
class FakeNodeGroup:
    """A managed node group of the cluster `kube` serves, as EKS reports and resizes it (module doc).

    `members`: node name -> its Ray worker pod, in the order the group fills; the first `desired`
    are in `kube.nodes` (a test builds both alike)."""

    kube: FakeKubeApi
    name: str
    members: dict[str, str]
    desired: int
    min_size: int = 0
    max_size: int = 2
    status: str = "ACTIVE"
    issues: list[dict] = field(default_factory=list)
    join_after_lists: int = 3
    fail_scale_out: dict | None = None
    updating_describes: int = 0  # describes left that still say UPDATING after an update
    updates: list[dict] = field(default_factory=list)  # each accepted UpdateNodegroupConfig body

    def describe(self, cluster: str) -> dict:
        status = self.status
        if self.updating_describes:
            self.updating_describes -= 1
            status = "UPDATING"
        return {
            "nodegroupName": self.name,
            "clusterName": cluster,
            "status": status,
            "capacityType": "ON_DEMAND",
            "scalingConfig": {
                "minSize": self.min_size,
                "maxSize": self.max_size,
                "desiredSize": self.desired,
            },
            "health": {"issues": list(self.issues)},
        }

    def update(self, body: dict) -> tuple[int, str | None, dict]:
        """(HTTP status, x-amzn-ErrorType or None, body) of UpdateNodegroupConfig."""
        if self.status not in ("ACTIVE", "DEGRADED") or self.updating_describes:
            return (
                409,
                "ResourceInUseException",
                {"message": "Nodegroup cannot be updated as it is currently not in Active State"},
            )
        size = body.get("scalingConfig", {}).get("desiredSize", self.desired)
        if not self.min_size <= size <= self.max_size:
            return (
                400,
                "InvalidParameterException",
                {
                    "message": f"desired capacity {size} must be between min size {self.min_size} and max size {self.max_size}"
                },
            )
        self.updates.append(body)
        self.updating_describes = 1
        names = list(self.members)
        if size < self.desired:
            for node_name in names[size : self.desired]:
                self.kube.nodes = [n for n in self.kube.nodes if n["metadata"]["name"] != node_name]
                self.kube.set_worker(self.members[node_name], None)
        elif size > self.desired and self.fail_scale_out is not None:
            self.status, self.issues = "DEGRADED", [self.fail_scale_out]
        elif size > self.desired:
            self.status, self.issues = "ACTIVE", []
            for node_name in names[self.desired : size]:
                self.kube.joining.append([self.join_after_lists, node(node_name), self.members[node_name]])
        self.desired = size
        return (
            200,
            None,
            {
                "update": {
                    "id": str(uuid.uuid4()),
                    "status": "InProgress",
                    "type": "ConfigUpdate",
                    "params": [{"type": "DesiredSize", "value": str(size)}],
                    "errors": [],
                }
            },
        )


@dataclass
class FakeAwsApis:
    """EKS DescribeCluster, DescribeNodegroup and UpdateNodegroupConfig, STS GetCallerIdentity/
    AssumeRole and EC2 DescribeInstances over plain HTTP on 127.0.0.1. `instances` are the instances
    EC2 lists (id -> LaunchTime, ISO 8601 UTC): an id not among them is one EC2 no longer knows;
    `ec2_refused`: EC2 answers every DescribeInstances with UnauthorizedOperation."""

    clusters: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # name -> (endpoint, CA PEM)
    node_groups: dict[str, FakeNodeGroup] = field(default_factory=dict)  # by name, in any cluster
    clock: Callable[[], float] = lambda: 1_800_000_000.0  # EKS's time of an update (epoch seconds)
    account: str = "123456789012"
    caller_arn: str = "arn:aws:iam::123456789012:user/deployer"
    access_keys_seen: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)
    expired_keys: set[str] = field(default_factory=set)  # session keys past their expiry
    instances: dict[str, str] = field(default_factory=dict)
    ec2_refused: bool = False
    ec2_requests: list[dict[str, list[str]]] = field(default_factory=list)

    def start(self) -> FakeAwsApis:
        self.server = serve_on_loopback({"GET": self._eks, "POST": self._post})
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def stop(self) -> None:
        stop_server(self.server)

    def _record_key(self, handler: BaseHTTPRequestHandler) -> None:
        authorization = handler.headers.get("Authorization", "")
        if "Credential=" in authorization:
            self.access_keys_seen.append(authorization.split("Credential=")[1].split("/")[0])

    def _reply(
        self, handler: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str, **headers: str
    ) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _no_node_group(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        body = json.dumps({"message": f"No node group found for name: {name}."}).encode()
        self._reply(
            handler, 404, body, "application/json", **{"x-amzn-ErrorType": "ResourceNotFoundException"}
        )

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        """STS or EC2 (form POST to /), or EKS UpdateNodegroupConfig."""
        parts = [urllib.parse.unquote(p) for p in handler.path.split("?")[0].strip("/").split("/")]
        if len(parts) != 5 or parts[0] != "clusters" or parts[4] != "update-config":
            return self._query(handler)
        self._record_key(handler)
        request = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length", 0))) or b"{}")
        group = self.node_groups.get(parts[3])
        if group is None:
            return self._no_node_group(handler, parts[3])
        code, error, body = group.update(request)
        if code == 200:
            body["update"]["createdAt"] = self.clock()
        headers = {"x-amzn-ErrorType": error} if error else {}
        self._reply(handler, code, json.dumps(body).encode(), "application/json", **headers)

    def _eks(self, handler: BaseHTTPRequestHandler) -> None:
        self._record_key(handler)
        parts = [urllib.parse.unquote(p) for p in handler.path.split("?")[0].strip("/").split("/")]
        if len(parts) == 4 and parts[2] == "node-groups":
            group = self.node_groups.get(parts[3])
            if group is None:
                return self._no_node_group(handler, parts[3])
            body = json.dumps({"nodegroup": group.describe(parts[1])}).encode()
            return self._reply(handler, 200, body, "application/json")
        name = parts[-1]
        if name not in self.clusters:
            body = json.dumps({"message": f"No cluster found for name: {name}."}).encode()
            return self._reply(
                handler, 404, body, "application/json", **{"x-amzn-ErrorType": "ResourceNotFoundException"}
            )
        endpoint, ca = self.clusters[name]
        cluster = {
            "name": name,
            "arn": f"arn:aws:eks:us-east-2:{self.account}:cluster/{name}",
            "endpoint": endpoint,
            "status": "ACTIVE",
            "certificateAuthority": {"data": base64.b64encode(ca).decode()},
        }
        self._reply(handler, 200, json.dumps({"cluster": cluster}).encode(), "application/json")

    def _query(self, handler: BaseHTTPRequestHandler) -> None:
        """STS and EC2 both speak the query protocol (form-encoded POST, XML answers): the action says which."""
        self._record_key(handler)
        form = urllib.parse.parse_qs(
            handler.rfile.read(int(handler.headers.get("Content-Length", 0))).decode()
        )
        if form.get("Action", [""])[0] == "DescribeInstances":
            return self._ec2_describe_instances(handler, form)
        return self._sts(handler, form)

    def _ec2_describe_instances(self, handler: BaseHTTPRequestHandler, form: dict[str, list[str]]) -> None:
        """EC2 DescribeInstances with the filter `instance-id` (EC2 API reference, DescribeInstances,
        `Filter.N.Name` and `Filter.N.Value.M`, and its example response): the instances EC2 lists
        whose id is among the filter's values, any other id left out (a filter matches; only
        `InstanceId.N` answers an unknown id with InvalidInstanceID.NotFound). An identity without
        ec2:DescribeInstances gets 403 UnauthorizedOperation in a `<Response><Errors>` document ("Error
        codes", "Error responses")."""
        self.ec2_requests.append(form)
        if self.ec2_refused:
            body = (
                "<Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to "
                "perform this operation.</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example"
                "</RequestID></Response>"
            )
            return self._reply(handler, 403, body.encode(), "text/xml")
        if form.get("Filter.1.Name") != ["instance-id"] or any(key.startswith("InstanceId.") for key in form):
            raise NotImplementedError(
                f"FakeAwsApis serves DescribeInstances by the instance-id filter only: {form}"
            )
        ids = [values[0] for key, values in sorted(form.items()) if key.startswith("Filter.1.Value.")]
        items = "".join(
            f"<item><instanceId>{instance}</instanceId><instanceType>g6.12xlarge</instanceType>"
            f"<launchTime>{self.instances[instance]}</launchTime>"
            "<instanceState><code>16</code><name>running</name></instanceState><reason/></item>"
            for instance in ids
            if instance in self.instances
        )
        body = (
            '<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            "<requestId>8f7724cf-496f-496e-8fe3-example</requestId><reservationSet><item>"
            f"<reservationId>r-1234567890abcdef0</reservationId><ownerId>{self.account}</ownerId>"
            f"<groupSet/><instancesSet>{items}</instancesSet></item></reservationSet>"
            "</DescribeInstancesResponse>"
        )
        self._reply(handler, 200, body.encode(), "text/xml;charset=UTF-8")

    def _sts(self, handler: BaseHTTPRequestHandler, form: dict[str, list[str]]) -> None:
        action = form.get("Action", [""])[0]
        ns = "https://sts.amazonaws.com/doc/2011-06-15/"
        if self.access_keys_seen and self.access_keys_seen[-1] in self.expired_keys:
            # STS's answer to a request signed with expired session credentials (query-protocol error).
            error = (
                f'<ErrorResponse xmlns="{ns}"><Error><Type>Sender</Type><Code>ExpiredToken</Code>'
                "<Message>The security token included in the request is expired</Message></Error>"
                "<RequestId>3</RequestId></ErrorResponse>"
            )
            return self._reply(handler, 403, error.encode(), "text/xml")
        if action == "GetCallerIdentity":
            arn = self.caller_arn
            if self.access_keys_seen and self.access_keys_seen[-1].startswith("ASIAFAKEROLE"):
                arn = f"arn:aws:sts::{self.account}:assumed-role/{self.assumed[-1].split('/')[-1]}/session"
            body = (
                f'<GetCallerIdentityResponse xmlns="{ns}"><GetCallerIdentityResult><Arn>{arn}</Arn>'
                f"<UserId>AIDAFAKE</UserId><Account>{self.account}</Account></GetCallerIdentityResult>"
                "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></GetCallerIdentityResponse>"
            )
        elif action == "AssumeRole":
            role = form["RoleArn"][0]
            self.assumed.append(role)
            expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            body = (
                f'<AssumeRoleResponse xmlns="{ns}"><AssumeRoleResult><Credentials>'
                f"<AccessKeyId>ASIAFAKEROLE{len(self.assumed)}</AccessKeyId><SecretAccessKey>secret</SecretAccessKey>"
                f"<SessionToken>token</SessionToken><Expiration>{expires}</Expiration></Credentials>"
                f"<AssumedRoleUser><Arn>{role}/session</Arn><AssumedRoleId>AROA:session</AssumedRoleId></AssumedRoleUser>"
                "</AssumeRoleResult><ResponseMetadata><RequestId>2</RequestId></ResponseMetadata></AssumeRoleResponse>"
            )
        else:
            return self._reply(handler, 400, b"<ErrorResponse/>", "text/xml")
        self._reply(handler, 200, body.encode(), "text/xml")


# --- the Ray head and workers -----------------------------------------------------------------------


@dataclass
class ScriptedJob:
    """A scripted Ray job (of the fake dashboard, or the in-process fake head): each look moves one
    status on and reveals that share of the log."""

    ray_job_id: str
    driver_log: str
    statuses: list[str]
    message: str | None = None
    looks: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    efa_traffic: dict[str, int] = field(default_factory=dict)  # counter -> what it adds on each node
    # The fixture Ray job whose NCCL lines this job's processes write to their NCCL log files
    # (`write_nccl_log_files`); None: it leaves none (a job submitted before they existed).
    nccl_lines_of: str | None = None

    def status(self) -> str:
        return self.statuses[min(self.looks, len(self.statuses) - 1)]

    def job_id(self) -> str | None:
        """Ray's job id, which exists once the job's driver registered (Ray 2.58
        dashboard/modules/job/utils.py: `job_id=driver.id if driver else None`): None while the job is
        PENDING, and for one that failed before its driver started (a runtime environment that failed)."""
        seen = self.statuses[: min(self.looks, len(self.statuses) - 1) + 1]
        return self.ray_job_id if {"RUNNING", "SUCCEEDED"} & set(seen) else None

    def logs(self) -> str:
        lines = self.driver_log.splitlines(keepends=True)
        shown = len(lines) * (min(self.looks, len(self.statuses) - 1) + 1) // len(self.statuses)
        return "".join(lines[:shown])


# The token of the fake cluster's Ray (on a cluster, the one in the Secret KubeRay creates).
RAY_TOKEN = "fake-cluster-ray-token"


@dataclass
class FakeRayDashboard:
    """The head pod's Ray Jobs REST API on 127.0.0.1 (the pod's localhost:8265 is translated here).

    Behind Ray's token authentication, as the RayCluster runs it. As Ray's middleware: the header
    `Authorization`, else `X-Ray-Authorization` (its cookie is for browsers), must be `Bearer <token>`
    (Ray 2.58 ray/_private/authentication/http_token_authentication.py, `get_token_auth_middleware`;
    the comparison is `validate_authentication_token`'s, of the whole header): none is 401, another
    403, each with Ray's plain-text body. The Jobs API is none of its public paths
    (dashboard/http_server_head.py, `public_exact_paths`)."""

    jobs: dict[str, ScriptedJob] = field(default_factory=dict)
    token: str = RAY_TOKEN

    def start(self) -> FakeRayDashboard:
        self.server = serve_on_loopback({"GET": self._serve})
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def stop(self) -> None:
        stop_server(self.server)

    def _record(self, submission_id: str, job: ScriptedJob) -> dict:
        status = job.status()
        return {
            "type": "SUBMISSION",
            "submission_id": submission_id,
            "job_id": job.job_id(),
            "status": status,
            "message": job.message if status == "FAILED" else None,
            "metadata": job.metadata,
            "entrypoint": "python -m training",
        }

    def _refusal(self, handler: BaseHTTPRequestHandler) -> tuple[int, str] | None:
        header = handler.headers.get("Authorization") or handler.headers.get("X-Ray-Authorization")
        if not header:
            return 401, "Unauthorized: Missing authentication token"
        if header != f"Bearer {self.token}":
            return 403, "Forbidden: Invalid authentication token"
        return None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        refusal = self._refusal(handler)
        if refusal is not None:
            text = refusal[1].encode()
            handler.send_response(refusal[0])
            handler.send_header("Content-Type", "text/plain; charset=utf-8")
            handler.send_header("Content-Length", str(len(text)))
            handler.end_headers()
            handler.wfile.write(text)
            return
        parts = handler.path.strip("/").split("/")
        body: Any
        if parts == ["api", "jobs"]:
            body = [self._record(sid, job) for sid, job in self.jobs.items()]
        elif len(parts) in (3, 4) and parts[:2] == ["api", "jobs"] and parts[2] in self.jobs:
            job = self.jobs[parts[2]]
            if len(parts) == 3:
                body = self._record(parts[2], job)
            else:
                body = {"logs": job.logs()}
                job.looks += 1  # one poll = the job record, then its logs
        else:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = json.dumps(body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


# What `readiness.HOST_LIMITS_SCRIPT` reads in a GPU worker pod on the EKS AL2023 NVIDIA AMI: its
# default driver branch is 580 (amazon-eks-ami issue 2470; nvidia-smi's header then says CUDA 13.0),
# the AWS DLC's PyTorch 2.13 is built for CUDA 13.0, and the locked-memory limit is the one AWS's EFA
# guide asks for (unlimited; what a given AMI release's containerd gives is not checked here).
HEALTHY_HOST_LIMITS = "driver 580.95.05\ndriver_cuda 13.0\nruntime_cuda 13.0\nmemlock unlimited\n"

# What the gate's probe adds to each worker node's counters (the fixture report's run, driver_probe.log:
# 8 ranks on 2 nodes, 25 calls of each collective at 1 MiB, 16 MiB, 256 MiB and 1 GiB): on NCCL's
# ring each node sends and receives 7/8 of each all_gather's and reduce_scatter's message and 14/8
# of each all_reduce's, 3.5 x 1297 MiB x 25 each way (nccl-tests doc/PERFORMANCE.md, the ring's bus
# factors).
PROBE_TRAFFIC = {
    "tx_bytes": 119_000_268_800,
    "rx_bytes": 119_000_272_896,
    "tx_pkts": 14_525_000,
    "rx_pkts": 14_525_004,
}
# What connection set-up alone moves (libfabric's handshakes): tens of KiB.
HANDSHAKE_TRAFFIC = {"tx_bytes": 32_768, "rx_bytes": 32_768, "tx_pkts": 64, "rx_pkts": 64}
# What a node's EFA counters hold before a job: earlier traffic (counters live as long as the device).
EFA_DEVICE = "rdmap16s27"
EFA_COUNTERS_AT_BOOT = {
    "tx_bytes": 7_340_032_000,
    "rx_bytes": 7_340_032_512,
    "tx_pkts": 870_000,
    "rx_pkts": 870_004,
    "send_bytes": 1_048_576,
    "recv_bytes": 1_048_576,
    "rdma_read_bytes": 7_338_983_424,
    "rdma_write_bytes": 0,
    "retrans_pkts": 3,
    "impaired_remote_conn_events": 0,
}


def write_nccl_log_files(
    session_logs: Path, nccl_dir: Path, pod_name: str, submission_id: str, ray_job_id: str
) -> None:
    """What a job submitted with `NCCL_DEBUG_FILE` leaves in a worker pod's `/tmp/ray`: one file per
    NCCL process, `nccl-<submission id>.<host>.<pid>.log` (NCCL src/debug.cc: %h is the host name up
    to its first dot, the pod's name; %p the pid), holding the NCCL lines that the fixture job
    `ray_job_id`'s processes on this pod wrote to their Ray worker logs."""
    nccl_dir.mkdir(parents=True, exist_ok=True)
    for out in sorted(session_logs.glob(f"worker-*-{ray_job_id}-*.out")):
        pid = out.name.rsplit("-", 1)[1].split(".")[0]
        lines = [line for line in out.read_text().splitlines(keepends=True) if "NCCL" in line]
        (nccl_dir / f"nccl-{submission_id}.{pod_name}.{pid}.log").write_text("".join(lines))


class FakeEfaSysfs:
    """One node's `/sys/class/infiniband`, in both views the kernel gives (module doc): `root`, the
    host's network namespace's, an EFA device with one port and its `hw_counters` files; `pod_view`,
    a pod network namespace's, the compat device whose port has attributes (`state`) but no
    `hw_counters`. A `stuck` device's counters do not move whatever the traffic."""

    def __init__(self, root: Path, device: str = EFA_DEVICE, counters: dict[str, int] | None = None):
        self.root = root
        self.pod_view = root.parent / f"{root.name}-pod-netns"
        self.stuck = False
        self.folder = root / device / "ports" / "1" / "hw_counters"
        self.folder.mkdir(parents=True, exist_ok=True)
        for view in (root, self.pod_view):
            port = view / device / "ports" / "1"
            port.mkdir(parents=True, exist_ok=True)
            (port / "state").write_text("4: ACTIVE\n")
        self.counters = dict(EFA_COUNTERS_AT_BOOT if counters is None else counters)
        self._write()

    def add(self, traffic: dict[str, int]) -> None:
        if self.stuck:
            return
        for name, count in traffic.items():
            self.counters[name] = self.counters.get(name, 0) + count
        self._write()

    def _write(self) -> None:
        for name, value in self.counters.items():
            (self.folder / name).write_text(f"{value}\n")


class FakeReaderNode:
    """One GPU node's EFA counter reader container, as the kubelet runs it and sees it.

    - It runs the real program: the reader DaemonSet's own container command (`reader_daemonset`),
      `$(NODE_IP)` expanded by the kubelet's rules (`counter_reader.kubelet_expand`) to 127.0.0.1, which stands in
      for the node's address, the port swapped for a free one (every fake node shares this
      machine) and the node's sysfs (`root`: a `FakeEfaSysfs` host view) appended as the sysfs
      root; `python` is the image's interpreter.
    - Ready is what the kubelet's readiness probe finds: an HTTP GET on the port answered 2xx
      within `timeoutSeconds`, 1 s by default (Kubernetes docs, "Configure Liveness, Readiness and
      Startup Probes"). A container whose program cannot start (`python` None: an image without
      one) or has died is not running: the pod shows CrashLoopBackOff, never Ready, and an exec
      into it is refused (`FakeKubeApi._exec`).

    `replaced` says when the container is down for a while, as during a DaemonSet rollout, which
    replaces a node's reader pod whenever its command or image changes (Kubernetes docs, "Perform a
    Rolling Update on a DaemonSet": the old pod is deleted before the new one starts).

    The container starts when the kubelet is first asked about it, so a test that never lists the
    readers starts no process; `stop_all` (an autouse fixture of tests/conftest.py) ends every one
    after each test.
    """

    PROBE_TIMEOUT_S = 1.0
    _started: ClassVar[list[FakeReaderNode]] = []

    def __init__(self, root: Path, python: str | None = sys.executable):
        self.root = root
        self.python = python
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.stopped = False
        self.replaced: Callable[[], bool] = lambda: False

    @classmethod
    def stop_all(cls) -> None:
        for reader in cls._started:
            reader.stop()
        cls._started.clear()

    def _start(self) -> None:
        if self.python is None or self.process is not None or self.stopped:
            return
        self._started.append(self)
        container = reader_container()
        env = kubelet_env(container["env"], {"status.hostIP": "127.0.0.1"})
        argv = [kubelet_expand(arg, env) for arg in container["command"]]
        self.port = free_port("127.0.0.1")
        argv = [str(self.port) if arg == str(READER_PORT) else arg for arg in argv]
        self.process = subprocess.Popen(
            [self.python, *argv[1:], str(self.root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10  # the interpreter's start, then the server's bind
        while self.process.poll() is None and not self._answers() and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        """The container dies and stays down (no restart is modelled)."""
        self.stopped = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        self._start()
        return self.process is not None and self.process.poll() is None and not self.replaced()

    def ready(self) -> bool:
        return self.running and self._answers()

    def _answers(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/"
            with urllib.request.urlopen(url, timeout=self.PROBE_TIMEOUT_S) as reply:
                return 200 <= reply.status < 300
        except OSError:
            return False

    def pod_status(self) -> dict:
        ready = self.ready()
        running = self.running
        state = {"running": {}} if running else {"waiting": {"reason": "CrashLoopBackOff"}}
        return {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {
                    "name": READER_CONTAINER,
                    "image": "ray",
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0 if running else 5,
                    "state": state,
                }
            ],
        }


@dataclass
class FakeRayPods:
    """Answers the commands the provider execs: the head's, against `dashboard`; the workers' over fixture logs.

    `head_jobs_api` really runs (this Python, as the image's would), `sh` log scripts really run over
    the fixture session folders; `ray job submit` is recorded and turned into a scripted job.
    """

    dashboard: FakeRayDashboard
    head_pod: str
    worker_logs: dict[str, Path]  # worker pod -> its Ray session log folder
    code_hash: str
    job_for_submission: Callable[[list[str]], ScriptedJob]
    efa: dict[str, FakeEfaSysfs] = field(default_factory=dict)  # node -> its EFA sysfs
    node_of: dict[str, str] = field(default_factory=dict)  # worker and reader pod -> its node
    # The head pod's emptyDir `/tmp/ray`, where the TrainingRun keeps its records of each job.
    head_tmp: Path | None = None
    host_limits: str = HEALTHY_HOST_LIMITS  # what each worker pod's node gives it (`HEALTHY_HOST_LIMITS`)
    # Worker pod -> its emptyDir `/tmp/ray`, where NCCL log files go (default: above its session logs).
    nccl_logs: dict[str, Path] = field(default_factory=dict)
    submissions: list[list[str]] = field(default_factory=list)
    probe_submissions: list[list[str]] = field(default_factory=list)

    def nccl_dir(self, pod_name: str) -> Path:
        return self.nccl_logs.get(pod_name, self.worker_logs[pod_name].parent)

    @staticmethod
    def _not_found(executable: str) -> ExecReply:
        """A command whose executable the container's image lacks, as containerd words it."""
        return ExecReply(
            not_started=(
                "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: "
                f'unable to start container process: exec: "{executable}": executable file not found in $PATH: unknown'
            )
        )

    def __call__(self, pod_name: str, container: str, argv: list[str]) -> ExecReply:
        if pod_name == self.head_pod:
            if argv[0] == "cat":
                return ExecReply(self.code_hash + "\n")
            if argv[:3] == ["ray", "job", "submit"]:
                submission_id = argv[argv.index("--submission-id") + 1]
                if submission_id in self.dashboard.jobs:
                    return ExecReply("", f"Job with submission_id {submission_id} already exists.", 1)
                job = self.job_for_submission(argv)
                if "--metadata-json" in argv:
                    job.metadata = json.loads(argv[argv.index("--metadata-json") + 1])
                self.dashboard.jobs[submission_id] = job
                probe = "training.fabric_probe" in argv  # the gate's probe before a job, kept apart
                (self.probe_submissions if probe else self.submissions).append(argv)
                for sysfs in self.efa.values():
                    sysfs.add(job.efa_traffic)
                if job.nccl_lines_of is not None:
                    assert self.nccl_logs, "give nccl_logs: a scripted job never writes into the fixtures"
                    for pod_name, logs in self.worker_logs.items():
                        write_nccl_log_files(
                            logs, self.nccl_dir(pod_name), pod_name, submission_id, job.nccl_lines_of
                        )
                return ExecReply(f"Job '{submission_id}' submitted successfully\n")
            if argv[:2] == ["python", "-c"]:
                local = [sys.executable, "-c", argv[2], self.dashboard.url, *argv[4:]]
                # In the head's Ray container environment: the token KubeRay sets from its Secret.
                outside = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
                return _run(local, env={**outside, **token_auth_env(self.dashboard.token)})
            if argv[0] == "sh" and self.head_tmp is not None:
                return _run([arg.replace("/tmp/ray/", f"{self.head_tmp}/") for arg in argv])
            return self._not_found(argv[0])
        node = self.efa.get(self.node_of.get(pod_name, ""))
        if pod_name not in self.worker_logs:  # a reader pod: the host's view of its node's sysfs
            assert argv[:2] == ["python", "-c"], argv
            local = {"/sys/class/infiniband": str(node.root) if node else "/nonexistent"}
            return _run([sys.executable, *(local.get(arg, arg) for arg in argv[1:])])
        if argv == host_limits_command():
            return ExecReply(self.host_limits)
        logs = self.worker_logs[pod_name]
        # The pod's emptyDir /tmp/ray (NCCL log files) is the folder above its session logs; its sysfs
        # shows the node's EFA device as a compat device, without counters.
        local = {"/tmp/ray/session_latest/logs": str(logs), "/tmp/ray": str(self.nccl_dir(pod_name))}
        if node is not None:
            local["/sys/class/infiniband"] = str(node.pod_view)
        return _run([local.get(arg, arg) for arg in argv])


def _run(argv: list[str], env: dict[str, str] | None = None) -> ExecReply:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    return ExecReply(done.stdout, done.stderr, done.returncode)
