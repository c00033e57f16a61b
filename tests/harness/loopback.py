"""Servers on 127.0.0.1 that the fakes answer from: an HTTP/1.1 server (TLS optional) with one
handler per method, its self-signed certificate, and `SilentEndpoint`, which accepts TCP connections
and never answers (like an endpoint whose packets are dropped)."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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


class SilentEndpoint:
    """Accepts TCP connections (the kernel's backlog does) and never answers: a black-holed endpoint."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.endpoint = f"https://127.0.0.1:{self.socket.getsockname()[1]}"

    def stop(self) -> None:
        self.socket.close()
