"""The Kubernetes API server of the cluster as the TrainingRun provider talks to it (TLS, REST and exec
over websockets). The other services it needs have their own fakes: EKS, STS and EC2
(`fake_aws_endpoints`), the Ray dashboard (`fake_ray_dashboard`), the pods' commands
(`fake_ray_pods`), a node's EFA sysfs (`fake_efa_sysfs`) and its counter reader (`fake_reader_node`).

Each models the real behaviour the provider depends on, and where that is documented:

- The Kubernetes API server over TLS with a self-signed certificate whose CA is what DescribeCluster
  returns. Requests need `Authorization: Bearer k8s-aws-v1.<base64url presigned STS GetCallerIdentity
  URL>` signed over the `x-k8s-aws-id` header (the aws-iam-authenticator token format EKS accepts);
  otherwise 401 with a `metav1.Status` body, as the API server answers. REST: list nodes, pods
  (label selectors), events (field selector), get a RayCluster custom object; and the two writes of
  the job's follower, each recorded (`patches`, `deletes`):
  - PATCH a node (`kubectl cordon`): a strategic merge or merge patch, merged into the node; a JSON
    Patch body must be a list of operations, so an object sent as one is refused with 400, as the API
    server fails to decode it (Kubernetes API concepts, "Patch"; apimachinery's JSON Patch is an
    array);
  - DELETE a pod (API reference, Pod `delete`, `gracePeriodSeconds`: "The value zero indicates
    delete immediately. If this value is nil, the default grace period for the specified type will
    be used", the pod's `terminationGracePeriodSeconds`, 30 s by default): with grace 0 the pod is
    gone at once; otherwise it gets its `deletionTimestamp`, now plus the grace, and stays until its
    kubelet ends it, which `deleted` (the test's kubelet, and KubeRay's replacement) may do. 404
    for a pod or node that is not there.
- Exec (`GET .../pods/<pod>/exec?command=...`, upgraded to a websocket; Kubernetes "remotecommand"
  protocols `v5.channel.k8s.io` / `v4.channel.k8s.io`): binary frames whose first byte is the channel
  (1 stdout, 2 stderr, 3 error); after the command ends the server writes one `metav1.Status` on
  channel 3 (`Success`, or `Failure` with reason `NonZeroExitCode` and an `ExitCode` cause) and closes.
  The kubernetes Python client offers `v5,v4` and reads exactly this (kubernetes/stream/ws_client.py).

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
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from platform_contract import PART_OF_LABELS
from tests.harness.fake_reader_node import FakeReaderNode
from tests.harness.loopback import self_signed_certificate, serve_on_loopback, stop_server
from workloads.efa_counter_reader import READER_CONTAINER, READER_LABELS, READER_NAMESPACE

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, section 1.3
STDOUT, STDERR, ERROR = 1, 2, 3

# --- Kubernetes objects as the API server serialises them -----------------------------------------


def node(
    name: str,
    gpus: str | None = "4",
    efa: str | None = "1",
    present: bool = True,
    ready: bool = True,
    instance_id: str = "i-0f0f0f0f0f0f0f0f0",
    ready_status: str | None = None,
    ready_since: str | None = None,
) -> dict:
    """A GPU node as the API server serves it; `spec.providerID` names its EC2 instance as EKS sets it
    (`aws:///<zone>/<instance id>`). Its Ready condition is "True" or "False" by `ready`, or
    `ready_status` ("Unknown": the node controller's word for a kubelet that stopped posting its
    status), last changed at `ready_since` (RFC 3339)."""
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
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready_status or ("True" if ready else "False"),
                    **({"lastTransitionTime": ready_since} if ready_since else {}),
                }
            ],
        },
    }


def pod(
    name: str,
    node_type: str,
    ready: bool = True,
    phase: str = "Running",
    node: str | None = "node-a",
    uid: str | None = None,
    deleted_at: str | None = None,
) -> dict:
    """A Ray pod of the RayCluster `ray-train`; `deleted_at` (RFC 3339): its deletionTimestamp, the
    end of its grace after a delete (a pod Terminating)."""
    container = "ray-head" if node_type == "head" else "ray-worker"
    deleting = {"deletionTimestamp": deleted_at, "deletionGracePeriodSeconds": 30} if deleted_at else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "namespace": "ray-train",
            "labels": {"ray.io/cluster": "ray-train", "ray.io/node-type": node_type},
            **deleting,
        },
        "spec": {"containers": [{"name": container, "image": "ray"}], "nodeName": node},
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


def reader_pod(name: str, node: str) -> dict:
    """An EFA counter reader pod of the DaemonSet, on `node` (`workloads.efa_counter_reader`).
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
            "nodeName": node,
            "hostNetwork": True,
        },
        "status": {"phase": "Pending"},
    }


def rfc3339(seconds: float) -> str:
    """A time as the API server writes it (metav1.Time: RFC 3339, whole seconds, UTC)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merged(into: dict, patch: dict) -> dict:
    """`into` with a merge patch applied (RFC 7386; for the fields patched here, a strategic merge
    patch merges the same way): objects merge key by key, a null removes, anything else replaces."""
    out = dict(into)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def selected(labels: dict, selector: str) -> bool:
    """Whether `labels` match an equality-based label selector (`a=b,c=d`), as the API server filters a list."""
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
    # The writes: each PATCH of a node (path, Content-Type, body) and DELETE of a pod (namespace,
    # name, the grace asked for: None for the pod's own).
    patches: list[tuple[str, str, dict]] = field(default_factory=list)
    deletes: list[tuple[str, str, int | None]] = field(default_factory=list)
    # Called with a pod deleted with a grace (now Terminating) and that grace: the test's kubelet.
    deleted: Callable[[dict, int], None] | None = None
    clock: Callable[[], float] = time.time  # the API server's clock, for a deletionTimestamp

    def start(self) -> FakeKubeApi:
        cert_file, key_file, self.ca_pem = self_signed_certificate(self.folder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._released = threading.Event()
        self.server = serve_on_loopback(
            {"GET": self._serve, "PATCH": self._serve, "DELETE": self._serve}, tls=context
        )
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
        # A write's body is read first, whatever the answer: what is left unread would be taken for
        # the next request on the kept-alive connection.
        body = self._body(handler) if handler.command in ("PATCH", "DELETE") else None
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
        if handler.command == "PATCH" and parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            return self._patch_node(handler, url.path, parts[3], body)
        if (
            handler.command == "DELETE"
            and len(parts) == 6
            and parts[:3] == ["api", "v1", "namespaces"]
            and parts[4] == "pods"
        ):
            return self._delete_pod(handler, parts[3], parts[5], query, body)
        if handler.command != "GET":
            return self._json(
                handler, 405, _status(405, "MethodNotAllowed", "the server does not allow this method")
            )
        if parts == ["api", "v1", "nodes"]:
            self._join_nodes()
            items = [n for n in self.nodes if selected(n["metadata"]["labels"], selector)]
            return self._json(
                handler, 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
            items = [
                self._live(p)
                for p in self.pods
                if p["metadata"]["namespace"] == parts[3] and selected(p["metadata"]["labels"], selector)
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

    @staticmethod
    def _body(handler: BaseHTTPRequestHandler) -> object:
        length = int(handler.headers.get("Content-Length") or 0)
        return json.loads(handler.rfile.read(length) or b"null") if length else None

    def _patch_node(self, handler: BaseHTTPRequestHandler, path: str, name: str, body: object) -> None:
        content_type = handler.headers.get("Content-Type", "").split(";")[0].strip()
        self.patches.append((path, content_type, body if isinstance(body, dict) else {"body": body}))
        if content_type == "application/json-patch+json" and not isinstance(body, list):
            return self._json(
                handler,
                400,
                _status(
                    400,
                    "BadRequest",
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
                ),
            )
        if content_type not in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
            return self._json(
                handler,
                415,
                _status(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format: {content_type}",
                ),
            )
        index = next((i for i, n in enumerate(self.nodes) if n["metadata"]["name"] == name), None)
        if index is None:
            return self._json(handler, 404, _status(404, "NotFound", f'nodes "{name}" not found'))
        self.nodes[index] = merged(self.nodes[index], body if isinstance(body, dict) else {})
        return self._json(handler, 200, self.nodes[index])

    def _delete_pod(
        self,
        handler: BaseHTTPRequestHandler,
        namespace: str,
        name: str,
        query: dict[str, list[str]],
        body: object,
    ) -> None:
        asked = query.get("gracePeriodSeconds", [None])[0]
        if asked is None and isinstance(body, dict):
            asked = body.get("gracePeriodSeconds")
        grace = None if asked is None else int(asked)
        self.deletes.append((namespace, name, grace))
        index = next(
            (
                i
                for i, p in enumerate(self.pods)
                if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace
            ),
            None,
        )
        if index is None:
            return self._json(handler, 404, _status(404, "NotFound", f'pods "{name}" not found'))
        pod_object = self.pods[index]
        if grace is None:
            grace = int(pod_object["spec"].get("terminationGracePeriodSeconds", 30))
        if grace == 0:
            del self.pods[index]
            return self._json(handler, 200, pod_object)
        pod_object["metadata"].setdefault("deletionTimestamp", rfc3339(self.clock() + grace))
        pod_object["metadata"].setdefault("deletionGracePeriodSeconds", grace)
        if self.deleted is not None:
            self.deleted(pod_object, grace)
        return self._json(handler, 200, pod_object)

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

    def set_worker(self, name: str, node: str | None) -> None:
        """KubeRay's worker pod `name` created anew: Running and Ready on `node`, or Pending
        without a node (the scheduler finds no GPU node); a new pod object gets a new UID."""
        index = next(i for i, p in enumerate(self.pods) if p["metadata"]["name"] == name)
        old = self.pods[index]
        fresh = pod(
            name,
            "worker",
            ready=node is not None,
            phase="Running" if node else "Pending",
            node=node,
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
