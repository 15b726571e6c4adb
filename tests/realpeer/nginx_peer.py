"""nginx (the Debian package) as a reverse proxy in front of an upstream, the way people deploy llama.cpp or
vLLM: one instance with three listeners on 127.0.0.1, from a generated config.

- ``tls_url``: TLS with h2 by ALPN (a self-signed certificate made here; ``ca_file`` is the PEM to trust);
- ``h2c_url``: HTTP/2 over cleartext with prior knowledge (``listen ... http2`` without ``ssl``);
- ``h1_url``: HTTP/1.1.

Each ends in ``/v1``. ``proxy_buffering off`` (streams pass as they come), a low ``keepalive_requests`` so a
long run meets GOAWAY (HTTP/2) and ``Connection: close`` (HTTP/1.1), and ``client_max_body_size`` of 1 MiB so
an over-large request gets nginx's own 413 while the body is still being sent.

The access log has one line per request: ``status bytes request_time protocol "request"``.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path

from llamacpp import PeerUnavailable, free_port
from processes import last_line, listening, stop, wait_started

#: nginx's default is 1,000 (HTTP/1.1 and HTTP/2 alike); lower, so the tier's runs cross it.
KEEPALIVE_REQUESTS = 100
MAX_BODY = "1m"

_CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 1024; }}
http {{
    log_format peer '$status $body_bytes_sent $request_time $server_protocol "$request"';
    access_log {prefix}/access.log peer;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests {keepalive_requests};
    client_max_body_size {max_body};
    upstream model {{ server {upstream}; }}
    proxy_http_version 1.1;
    proxy_buffering off;
    proxy_request_buffering off;
    proxy_read_timeout 120s;
    proxy_set_header Host $host;
    proxy_set_header Connection "";
    server {{
        listen 127.0.0.1:{tls_port} ssl http2;
        ssl_certificate {prefix}/cert.pem;
        ssl_certificate_key {prefix}/key.pem;
        location / {{ proxy_pass http://model; }}
    }}
    server {{
        listen 127.0.0.1:{h2c_port} http2;
        location / {{ proxy_pass http://model; }}
    }}
    server {{
        listen 127.0.0.1:{h1_port};
        location / {{ proxy_pass http://model; }}
    }}
}}
"""


def _self_signed(prefix: Path) -> None:
    """A certificate for 127.0.0.1 and localhost, with cryptography (llmchat's own dependency)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmchat real-peer nginx")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (prefix / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (prefix / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


class Nginx:
    """A running nginx in front of ``upstream`` (``host:port``); :meth:`close` stops it."""

    def __init__(self, prefix: Path, upstream: str, *, ready_s: float = 20.0) -> None:
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if binary is None:
            raise PeerUnavailable("nginx is missing: apt-get install nginx-light (scripts/realpeer does it as root)")
        self.prefix = prefix
        for folder in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / folder).mkdir(parents=True, exist_ok=True)
        _self_signed(prefix)
        self.tls_port, self.h2c_port, self.h1_port = free_port(), free_port(), free_port()
        config = prefix / "nginx.conf"
        config.write_text(
            _CONFIG.format(
                prefix=prefix, upstream=upstream, tls_port=self.tls_port, h2c_port=self.h2c_port,
                h1_port=self.h1_port, keepalive_requests=KEEPALIVE_REQUESTS, max_body=MAX_BODY,
            )
        )
        (prefix / "access.log").touch()
        self._out = open(prefix / "stderr.log", "ab")
        self.process = subprocess.Popen(
            [binary, "-p", str(prefix), "-c", str(config), "-e", str(prefix / "error.log")],
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_ready(ready_s)
        except BaseException:
            self.close()
            raise

    @property
    def ca_file(self) -> str:
        return str(self.prefix / "cert.pem")

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}/v1"

    @property
    def h2c_url(self) -> str:
        return f"http://127.0.0.1:{self.h2c_port}/v1"

    @property
    def h1_url(self) -> str:
        return f"http://127.0.0.1:{self.h1_port}/v1"

    def access_log_text(self) -> str:
        return (self.prefix / "access.log").read_text(errors="replace")

    def error_log_text(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_ready(self, ready_s: float) -> None:
        ports = (self.tls_port, self.h2c_port, self.h1_port)
        failed = wait_started(self.process, lambda: all(listening(port) for port in ports), "nginx",
                              lambda: last_line(self.prefix / "error.log"), ready_s)
        if failed:
            raise PeerUnavailable(f"{failed} (ports {ports})")

    def close(self) -> None:
        stop(self.process)
        self._out.close()
