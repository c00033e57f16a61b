"""A real S3 API on loopback: moto's S3 server (the WSGI app `moto.server.ThreadedMotoServer` serves)
behind a thin layer that logs each request, can slow what clients send to a rate, and can refuse the
requests a test names.

Clients reach it as the cluster's pods reach S3: pyarrow's S3 filesystem (Ray Train's storage, and
`training.components.storage`) and boto3 read the standard `AWS_ENDPOINT_URL` (`S3Server.env`). The
rate limit models one link that every upload shares (a node's path to S3): each chunk of a request
body waits its turn at `rate_bytes_per_s`. A refusal answers S3's `InternalError` (500), which the
AWS SDK retries (its standard retry strategy) and then gives up on: a part or an object that never
arrives.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import boto3
import requests
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
REFUSAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>refused by the test</Message></Error>"
)


@dataclass(frozen=True)
class S3Request:
    method: str
    key: str  # bucket/key as the path names it
    query: str
    status: int
    ranged: bool  # a GET of a byte range (`Range` header)
    received: int  # request body bytes
    range_bytes: int | None = None  # the bytes a `Range: bytes=a-b` header asks for


@dataclass
class Refusal:
    """Refuse requests whose method is `method` and whose key matches `key` (a regex), each time."""

    method: str
    key: str
    refused: int = 0

    def matches(self, method: str, key: str) -> bool:
        return method == self.method and re.search(self.key, key) is not None


class _Quiet(MotoRequestHandler):
    """Moto's request handler without a console line per request (the log is `S3Server.requests`)."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Throttled:
    """A request body read in small pieces, each waiting its turn on the server's shared link, so bytes
    keep flowing at the link's rate: the AWS SDK aborts a transfer that stalls for its request timeout
    (3 s by default; on Linux curl's low-speed limit), as it would a stalled connection."""

    PIECE = 16 << 10

    def __init__(self, stream: Any, length: int | None, wait: Callable[[int], None]) -> None:
        """`length`: the body's Content-Length (None: a body whose stream ends by itself)."""
        self.stream, self.left, self.wait = stream, length, wait

    def read(self, size: int = -1) -> bytes:
        if self.left is not None:
            size = self.left if size < 0 else min(size, self.left)
        pieces: list[bytes] = []
        got = 0
        while size < 0 or got < size:
            piece: bytes = self.stream.read(self.PIECE if size < 0 else min(self.PIECE, size - got))
            if not piece:
                break
            self.wait(len(piece))
            pieces.append(piece)
            got += len(piece)
        if self.left is not None:
            self.left -= got
        return b"".join(pieces)

    def readline(self, size: int = -1) -> bytes:
        data: bytes = self.stream.readline(size)
        self.wait(len(data))
        return data

    def __iter__(self) -> Iterable[bytes]:
        return iter(self.readline, b"")


@dataclass
class S3Server:
    """Start with `start()`; `rate_bytes_per_s` None sends at loopback speed."""

    rate_bytes_per_s: float | None = None
    refusals: list[Refusal] = field(default_factory=list)
    requests: list[S3Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._link_free_at = 0.0
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> S3Server:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._layer(app), threaded=True, request_handler=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        # moto's backends live in this process and outlive a server: start from an empty account.
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()
        self.requests.clear()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client process reaches this server with."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            **CREDENTIALS,
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server, for a test's own look at the objects."""
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def of(self, method: str, key_pattern: str) -> list[S3Request]:
        """The requests logged of `method` on keys matching `key_pattern`."""
        return [r for r in list(self.requests) if r.method == method and re.search(key_pattern, r.key)]

    def _wait_for_link(self, size: int) -> None:
        if self.rate_bytes_per_s is None or size <= 0:
            return
        with self._lock:
            start = max(time.monotonic(), self._link_free_at)
            self._link_free_at = start + size / self.rate_bytes_per_s
            done_at = self._link_free_at
        time.sleep(max(0.0, done_at - time.monotonic()))

    def _layer(self, app: Any) -> Callable[..., Iterable[bytes]]:
        def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            method, key = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "").lstrip("/")
            query, received = environ.get("QUERY_STRING", ""), int(environ.get("CONTENT_LENGTH") or 0)
            ranged = "HTTP_RANGE" in environ
            asked = re.fullmatch(r"bytes=(\d+)-(\d+)", environ.get("HTTP_RANGE", ""))
            range_bytes = int(asked.group(2)) - int(asked.group(1)) + 1 if asked else None
            refusal = next((rule for rule in self.refusals if rule.matches(method, key)), None)
            if refusal is not None:
                environ["wsgi.input"].read(received)
                refusal.refused += 1
                self.requests.append(S3Request(method, key, query, 500, ranged, received))
                start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
                return [REFUSAL]
            length = int(environ["CONTENT_LENGTH"]) if environ.get("CONTENT_LENGTH") else None
            environ["wsgi.input"] = _Throttled(environ["wsgi.input"], length, self._wait_for_link)
            status: list[int] = []

            def record(code: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
                status.append(int(code.split()[0]))
                return start_response(code, headers, *rest)

            body = app(environ, record)
            self.requests.append(
                S3Request(method, key, query, status[0] if status else 0, ranged, received, range_bytes)
            )
            return body

        return serve
