"""EKS, STS and EC2 as the TrainingRun provider reaches them over HTTP, from one loopback server.

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
"""

from __future__ import annotations

import base64
import datetime
import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.harness.fake_kube_api import FakeKubeApi, node
from tests.harness.loopback import serve_on_loopback, stop_server


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
