"""What the gateway's client tests (tests/integration/test_gateway_clients.py)
fetch, and how they trust it:

- :func:`make_ca`: a local CA (made with `cryptography`) and a certificate it
  signs for 127.0.0.1 and `localhost`, written as PEM files a client is told
  to trust (curl's --cacert, requests' verify=, an ssl context for httpx).
- :class:`SeeingSite`: an HTTP or HTTPS site on 127.0.0.1 that records, for
  every request, the path and the client address it came from. A request
  from 127.0.0.1 itself came without a proxy: it is counted as `direct` and
  refused (403). Every other address gets `PATH for ADDRESS`. The headers
  each path was asked with are kept too.
- `python -m tests.support.gateway_site URL OUT [PROXY]`: a Scrapy crawl of
  one URL with Scrapy's stock middlewares only (HttpProxyMiddleware takes
  PROXY, credentials in it, as `request.meta["proxy"]`, or else the
  `http_proxy`/`https_proxy` environment); writes the answer to OUT as JSON.
  Run as a subprocess: Twisted's reactor starts once per process.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import ssl
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.http import ServedInThread

DIRECT = "127.0.0.1"


# -- the CA ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalCA:
    ca_pem: Path  # the CA's certificate: what clients trust
    cert_pem: Path  # the site's certificate (127.0.0.1, localhost), signed by the CA
    key_pem: Path  # the site's key
    spki_sha256: str  # base64 SHA-256 of the site's public key (Chromium's SPKI list)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_pem, self.key_pem)
        return context

    def client_context(self) -> ssl.SSLContext:
        """Verifies against this CA only (hostname checked)."""
        return ssl.create_default_context(cafile=str(self.ca_pem))


def make_ca(directory: Path) -> LocalCA:
    """A CA and the site's certificate, valid for a day, as files in `directory`."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress-proxies test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(DIRECT)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    found = LocalCA(directory / "ca.pem", directory / "site.pem", directory / "site-key.pem", "")
    found.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return LocalCA(
        found.ca_pem,
        found.cert_pem,
        found.key_pem,
        base64.b64encode(hashlib.sha256(spki).digest()).decode(),
    )


# -- the site --------------------------------------------------------------------------------


class SeeingSite(ServedInThread):
    """See the module's doc. `tls`: the server context that makes it HTTPS."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.seen: defaultdict[str, list[str]] = defaultdict(list)  # path -> client addresses
        self.headers: dict[str, list[tuple[str, str]]] = {}  # path -> its last request's headers
        self.direct = 0
        self.handshake_errors: list[str] = []
        self._lock = threading.Lock()
        self._serve(_Server(self, ("127.0.0.1", 0), _Handler))

    @property
    def base(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"

    def answer(self, address: str, path: str, headers: list[tuple[str, str]]) -> tuple[int, bytes]:
        with self._lock:
            self.seen[path].append(address)
            self.headers[path] = headers
            if address == DIRECT:
                self.direct += 1
                return 403, b"no direct requests here\n"
        return 200, f"{path} for {address}\n".encode()


class _Server(ThreadingHTTPServer):
    def __init__(self, site: SeeingSite, *args: Any) -> None:
        self.site = site
        super().__init__(*args)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake in the request's own thread, not the accepting one.
        if self.site.tls is not None:
            try:
                request = self.site.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                self.site.handshake_errors.append(f"{client_address[0]}: {exc}")
                return
        super().finish_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as sites have it
    server: _Server

    def do_GET(self) -> None:
        headers = [(k.lower(), v) for k, v in self.headers.items()]
        status, body = self.server.site.answer(self.client_address[0], self.path, headers)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


# -- Scrapy, stock -----------------------------------------------------------------------------


def scrapy_fetch(url: str, out: Path, proxy: str | None) -> None:
    """One request with Scrapy's default middlewares (HttpProxyMiddleware among
    them); `proxy` goes into request.meta, else the environment's proxy counts."""
    import scrapy
    from scrapy.crawler import CrawlerProcess
    from scrapy.http import Response

    answers: list[dict[str, Any]] = []

    class Fetch(scrapy.Spider):
        name = "fetch"

        async def start(self) -> Any:
            meta = {"proxy": proxy} if proxy else {}
            yield scrapy.Request(url, meta=meta, callback=self.parse, dont_filter=True)

        def parse(self, response: Response, **kwargs: Any) -> None:
            answers.append({"status": response.status, "text": response.text, "url": response.url})

    process = CrawlerProcess(
        {
            "TELNETCONSOLE_ENABLED": False,
            "ROBOTSTXT_OBEY": False,
            "RETRY_ENABLED": False,
            "HTTPERROR_ALLOW_ALL": True,
            "DOWNLOAD_TIMEOUT": 20,
            "LOG_LEVEL": "INFO",
        }
    )
    process.crawl(Fetch)
    process.start()
    out.write_text(json.dumps(answers))


if __name__ == "__main__":
    scrapy_fetch(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
