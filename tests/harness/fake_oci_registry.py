"""Container registries as the preview reads an image tag's digest from them
(`infra.preflight.reads.image_digests`), one HTTP server on 127.0.0.1 per registry host.

What each host models, from the OCI distribution spec v1.1.1 (opencontainers/distribution-spec
spec.md):

- "Checking if content exists in the registry": `HEAD /v2/<name>/manifests/<reference>` answers
  `200` with `Content-Type`, `Content-Length` and, unless the host leaves it out,
  `Docker-Content-Digest`; `404` for a manifest it lacks.
- "Pulling manifests": `GET` of the same URL answers the manifest's bytes, in the type the `Accept`
  header asks for: an image index is served only to a client that lists
  `application/vnd.oci.image.index.v1+json` (a registry that cannot convert answers 404).
- "Error Codes": a 4xx body is `{"errors": [{"code": ...}]}` (`MANIFEST_UNKNOWN`, `NAME_UNKNOWN`,
  `UNAUTHORIZED`, `DENIED`).

And the authentication around it, from Distribution's token authentication spec
(distribution/distribution docs/content/spec/auth/token.md): a request without credentials gets
`401` with `WWW-Authenticate: Bearer realm=...,service=...`, the realm's `GET ?scope=&service=`
answers `{"token": ...}`, and the request with `Authorization: Bearer <token>` succeeds; a token is
good for the one repository its scope named. Each host answers as its registry does:

| flavour | challenge | token endpoint | digest header |
| --- | --- | --- | --- |
| `public-ecr` (public.ecr.aws) | `Bearer realm="<host>/token/",service="public.ecr.aws",scope="aws"` | `/token/`, needs `service=public.ecr.aws` and a repository scope | HEAD and GET |
| `quay` (quay.io) | `Basic realm="quay.io", Bearer realm="<host>/v2/auth",service="quay.io"`, one line | `/v2/auth` | HEAD and GET |
| `nvcr` (nvcr.io) | `Bearer realm="<host>/proxy_auth",scope="repository:<name>:pull"` | `/proxy_auth`, no service | HEAD and GET |
| `ecr` (a private ECR registry, EKS's own) | `Basic realm="<host>/",service="ecr.amazonaws.com"`; the password is an ECR authorization token | none | HEAD only: ECR leaves it out of GET (aws/containers-roadmap#1931, ChangemakerStudios/Docker.Registry.DotNet#34) |
| `open` | none | none | HEAD and GET |

A host may leave the header out of HEAD too (`digest_on_head=False`: the client must hash the GET),
or send every `/v2/` request on to another host with a 307 (`redirect_to`, as registry.k8s.io sends
pulls to a regional Artifact Registry). A host no server serves is unreachable: its address is a
closed port on 127.0.0.1 (connection refused), as is every host while `FakeRegistries.down`;
`SilentEndpoint` (loopback.py) is one that never answers.

`serving_the_program` points the whole program (`tests.harness.program.run_program`) at these hosts
through the fetch layer's seam (`image_digests.REGISTRY`), and answers the two invokes the pinning
makes of the engine: `pulumi:pulumi:readStackOutputs` (the stack's outputs as the backend holds
them after its last `pulumi up`, `FakeRegistries.stack_outputs`) and the AWS provider's
`aws:ecr/getAuthorizationToken:getAuthorizationToken` (ECR API reference, GetAuthorizationToken:
`authorizationToken` is base64 of `AWS:<password>`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from infra.aws_rules.image_pins import ECR_HOST
from infra.config.key_parsers import parse_image_reference
from infra.preflight.reads import image_digests
from infra.preflight.reads.image_digests import Registry
from tests.harness.loopback import serve_on_loopback, stop_server

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ECR_PASSWORD = "fake-ecr-password"
ECR_TOKEN = base64.b64encode(f"AWS:{ECR_PASSWORD}".encode()).decode()  # GetAuthorizationToken's token
_MANIFEST_PATH = re.compile(r"/v2/(?P<name>.+)/manifests/(?P<reference>[^/]+)")


def index_manifest(repository: str, tag: str) -> bytes:
    """An OCI image index for two platforms, its bytes fixed by repository and tag (as a published tag's are)."""
    platforms = [("amd64", "linux"), ("arm64", "linux")]
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": "sha256:" + hashlib.sha256(f"{repository}:{tag}:{arch}".encode()).hexdigest(),
                    "size": 1024,
                    "platform": {"architecture": arch, "os": os},
                }
                for arch, os in platforms
            ],
        },
        indent=3,
    ).encode()


def digest_of(manifest: bytes) -> str:
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def flavour_of(host: str) -> str:
    """How the registry at `host` authenticates (the table above)."""
    if ECR_HOST.fullmatch(host):
        return "ecr"
    return {"public.ecr.aws": "public-ecr", "quay.io": "quay", "nvcr.io": "nvcr"}.get(host, "open")


@dataclass
class Request:
    method: str
    path: str  # with its query
    authorization: str | None
    accept: str | None


@dataclass
class FakeRegistryHost:
    """One registry host and the manifests it holds, by (repository, tag)."""

    host: str
    flavour: str = "open"
    manifests: dict[tuple[str, str], bytes] = field(default_factory=dict)
    digest_on_head: bool = True
    digest_on_get: bool = True
    redirect_to: FakeRegistryHost | None = None
    requests: list[Request] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        if self.flavour == "ecr":
            self.digest_on_get = False

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def push(self, repository: str, tag: str, manifest: bytes | None = None) -> str:
        """Tags `manifest` (by default an index of its own) in `repository`; its digest."""
        self.manifests[(repository, tag)] = (
            manifest if manifest is not None else index_manifest(repository, tag)
        )
        return digest_of(self.manifests[(repository, tag)])

    def start(self) -> FakeRegistryHost:
        self.server = serve_on_loopback({"GET": self._serve, "HEAD": self._serve})
        return self

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)
            self.server = None

    def manifest_requests(self, method: str | None = None) -> list[Request]:
        return [r for r in self.requests if "/manifests/" in r.path and method in (None, r.method)]

    # --- the server -------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests.append(
            Request(
                handler.command,
                handler.path,
                handler.headers.get("Authorization"),
                handler.headers.get("Accept"),
            )
        )
        url = urlsplit(handler.path)
        if self.redirect_to is not None and url.path.startswith("/v2/"):
            return _answer(handler, 307, {"Location": f"{self.redirect_to.url}{handler.path}"})
        token_path = {"public-ecr": "/token/", "quay": "/v2/auth", "nvcr": "/proxy_auth"}.get(self.flavour)
        if url.path == token_path and handler.command == "GET":
            return self._token(handler, parse_qs(url.query))
        manifest_path = _MANIFEST_PATH.fullmatch(url.path)
        if manifest_path is None:
            return _error(handler, 404, "NAME_UNKNOWN")
        name, reference = manifest_path["name"], manifest_path["reference"]
        if not self._admits(handler.headers.get("Authorization"), name):
            challenge = self._challenge(name)
            return _error(handler, 401, "UNAUTHORIZED", {"WWW-Authenticate": challenge} if challenge else {})
        if not any(repository == name for repository, _ in self.manifests):
            return _error(handler, 404, "NAME_UNKNOWN")
        manifest = self.manifests.get((name, reference))
        if manifest is None or OCI_INDEX not in (handler.headers.get("Accept") or ""):
            return _error(handler, 404, "MANIFEST_UNKNOWN")
        headers = {"Content-Type": OCI_INDEX, "Docker-Distribution-Api-Version": "registry/2.0"}
        if self.digest_on_head if handler.command == "HEAD" else self.digest_on_get:
            headers["Docker-Content-Digest"] = digest_of(manifest)
        return _answer(handler, 200, headers, manifest, head=handler.command == "HEAD")

    def _challenge(self, name: str) -> str:
        return {
            "public-ecr": f'Bearer realm="{self.url}/token/",service="public.ecr.aws",scope="aws"',
            "quay": f'Basic realm="quay.io", Bearer realm="{self.url}/v2/auth",service="quay.io"',
            "nvcr": f'Bearer realm="{self.url}/proxy_auth",scope="repository:{name}:pull"',
            "ecr": f'Basic realm="{self.url}/",service="ecr.amazonaws.com"',
        }.get(self.flavour, "")

    def _admits(self, authorization: str | None, name: str) -> bool:
        if self.flavour == "open":
            return True
        if self.flavour == "ecr":
            return authorization == f"Basic {ECR_TOKEN}"
        return authorization == f"Bearer {self.flavour}-token-for-{name}"

    def _token(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        """A token for the one repository the scope names; public ECR insists on its service name."""
        scope = query.get("scope", [""])[0]
        pulled = re.fullmatch(r"repository:(.+):pull", scope)
        service = query.get("service", [""])[0]
        if pulled is None or (self.flavour == "public-ecr" and service != "public.ecr.aws"):
            return _error(handler, 400, "DENIED")
        body = json.dumps({"token": f"{self.flavour}-token-for-{pulled[1]}", "expires_in": 300}).encode()
        return _answer(handler, 200, {"Content-Type": "application/json"}, body)


def _answer(
    handler: BaseHTTPRequestHandler,
    status: int,
    headers: dict[str, str],
    body: bytes = b"",
    head: bool = False,
) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if not head:
        handler.wfile.write(body)


def _error(
    handler: BaseHTTPRequestHandler, status: int, code: str, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"errors": [{"code": code, "message": code.lower().replace("_", " ")}]}).encode()
    head = handler.command == "HEAD"
    _answer(handler, status, {"Content-Type": "application/json", **(headers or {})}, body, head=head)


def closed_port_url() -> str:
    """An address on 127.0.0.1 where nothing listens: a connection there is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@dataclass
class FakeRegistries:
    """The registry hosts a test serves, by the host name image references use; any other host is
    unreachable, and so is every host while `down`. `stack_outputs`: the stack's outputs as the
    backend holds them (`serving_the_program`)."""

    hosts: dict[str, FakeRegistryHost] = field(default_factory=dict)
    unreachable: str = field(default_factory=closed_port_url)
    stack_outputs: dict[str, Any] = field(default_factory=dict)
    record_reads: list[str] = field(default_factory=list)
    ecr_token_reads: list[dict[str, Any]] = field(default_factory=list)
    pushed: set[str] = field(default_factory=set)
    down: bool = False

    def host(self, host: str, **options: Any) -> FakeRegistryHost:
        """The served host of that name, started on first use with its registry's flavour."""
        if host not in self.hosts:
            self.hosts[host] = FakeRegistryHost(host, flavour_of(host), **options).start()
        return self.hosts[host]

    def push(self, reference: str) -> str:
        """Tags an image for `<host>/<repository>:<tag>` on its host; its digest."""
        image = parse_image_reference(reference)
        assert image.tag is not None, reference
        self.pushed.add(reference)
        return self.host(image.api_host).push(image.repository, image.tag)

    def endpoint(self, host: str) -> str:
        """The seam's address of `host` (`Registry.endpoint`)."""
        return self.hosts[host].url if host in self.hosts and not self.down else self.unreachable

    def credentials(self, host: str) -> str | None:
        """What `image_digests.ecr_authorization` gives: the ECR token for an ECR host."""
        return f"Basic {ECR_TOKEN}" if ECR_HOST.fullmatch(host) else None

    def registry(self, timeout_s: float = 2.0) -> Registry:
        return Registry(endpoint=self.endpoint, credentials=self.credentials, timeout_s=timeout_s)

    def manifest_requests(self) -> list[Request]:
        return [request for host in self.hosts.values() for request in host.manifest_requests()]

    def stop(self) -> None:
        for host in self.hosts.values():
            host.stop()


def the_programs_images(region: str) -> list[str]:
    """The tag references the program runs in `region` by default: the Ray image and the charts'."""
    from infra.config.key_parsers import DEFAULT_IMAGE
    from workloads.manifests.charts import chart_images

    return [DEFAULT_IMAGE, *chart_images(region).values()]


# The registries a `serving_the_program` block serves, while one is open.
_SERVING: list[FakeRegistries] = []


@contextmanager
def serving_the_program(*references: str) -> Iterator[FakeRegistries]:
    """The program's registries for `run_program`: each of `references` pushed to its host; the fetch
    layer pointed at them; the stack's outputs and ECR's token answered as the engine and the AWS
    provider would (the module docstring). ECR's token comes through the program's own
    `image_digests.ecr_authorization`, so the invoke is the program's. Inside an open block, a nested one
    pushes its references to the same registries and serves nothing of its own."""
    if _SERVING:
        for reference in references:
            if reference not in _SERVING[-1].pushed:
                _SERVING[-1].push(reference)
        yield _SERVING[-1]
        return
    from tests.harness.program import ProgramMocks  # which a `run_program` that serves this imports

    fakes = FakeRegistries()
    for reference in references:
        fakes.push(reference)
    answered = ProgramMocks.call

    def call(mocks: ProgramMocks, args: Any) -> dict:
        if args.token == "pulumi:pulumi:readStackOutputs":
            fakes.record_reads.append(args.args["name"])
            return {"name": args.args["name"], "outputs": dict(fakes.stack_outputs), "secretOutputNames": []}
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            fakes.ecr_token_reads.append(dict(args.args))
            region = args.args.get("region") or mocks.aws.region
            return {
                "authorizationToken": ECR_TOKEN,
                "userName": "AWS",
                "password": ECR_PASSWORD,
                "proxyEndpoint": f"https://123456789012.dkr.ecr.{region}.amazonaws.com",
                "expiresAt": "2026-12-06T06:00:00Z",
                "id": region,
                "region": region,
                "registryId": "123456789012",
            }
        return answered(mocks, args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgramMocks, "call", call)
        patch.setattr(image_digests, "REGISTRY", Registry(endpoint=fakes.endpoint, timeout_s=2.0))
        _SERVING.append(fakes)
        try:
            yield fakes
        finally:
            _SERVING.pop()
            fakes.stop()
