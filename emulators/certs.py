"""Generated TLS material for the local stack (a private CA and a server certificate)."""

from __future__ import annotations

import fcntl
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trustme

SERVER_NAMES = (
    "127.0.0.1",
    "localhost",
    "::1",
    "api.push.apple.com",
    "api.sandbox.push.apple.com",
    "api.development.push.apple.com",
    "fcm.googleapis.com",
    "oauth2.googleapis.com",
)
ALPN_PROTOCOLS = ["h2", "http/1.1"]


@dataclass(frozen=True)
class TlsMaterial:
    directory: Path
    ca_cert: Path  # ca.pem: trust this in clients
    server_cert: Path  # server.pem: leaf + chain
    server_key: Path  # server.key
    server_context: ssl.SSLContext

    def client_context(self, alpn: list[str] | None = None) -> ssl.SSLContext:
        """A client context trusting the generated CA (no ALPN unless given)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        if alpn:
            ctx.set_alpn_protocols(alpn)
        return ctx


def server_ssl_context(server_cert: Path, server_key: Path) -> ssl.SSLContext:
    """A server context for ``server_cert``/``server_key`` offering ALPN h2 and http/1.1.

    Clients that offer no ALPN are accepted too (the server then sniffs the protocol).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.load_cert_chain(str(server_cert), str(server_key))
    ctx.set_alpn_protocols(ALPN_PROTOCOLS)
    return ctx


def _material(directory: Path) -> TlsMaterial:
    ca, cert, key = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    return TlsMaterial(directory, ca, cert, key, server_ssl_context(cert, key))


def generate_tls_material(directory: Path) -> TlsMaterial:
    """Create a CA and a server certificate for loopback and the providers' host names.

    Writes ``ca.pem``, ``server.pem`` (certificate chain) and ``server.key`` into ``directory``
    (created if missing, files overwritten).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="fanout-harness local CA")
    leaf = ca.issue_cert(*SERVER_NAMES, organization_name="fanout-harness simulators")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    (directory / "server.pem").write_bytes(chain)
    key_path = directory / "server.key"
    key_path.write_bytes(leaf.private_key_pem.bytes())
    key_path.chmod(0o600)
    return _material(directory)


def load_or_generate_tls_material(directory: Path) -> TlsMaterial:
    """Reuse ``ca.pem``/``server.pem``/``server.key`` in ``directory`` if all exist, else generate.

    Reuse keeps clients that already trust the CA working across simulator restarts.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = ("ca.pem", "server.pem", "server.key")
    # Simulators sharing a directory start at the same time (a stack's APNs and FCM): without
    # the lock both generated, one CA overwrote the other's, and a reader in between found an
    # empty ca.pem (NO_CERTIFICATE_OR_CRL_FOUND).
    with (directory / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((directory / n).is_file() for n in names):
            try:
                return _material(directory)
            except (ssl.SSLError, OSError):
                pass
        return generate_tls_material(directory)


def simulator_tls(
    name: str, tls: bool, cert_dir: Path | None
) -> tuple[ssl.SSLContext | None, Path | None]:
    """TLS for a simulator entry point: (server context or None, temp dir to remove or None).

    Uses ``cert_dir`` (reusing material found there) or a fresh temp dir; prints where the
    material is (stderr) so clients can trust ``ca.pem``.
    """
    if not tls:
        return None, None
    temp: Path | None = None
    if cert_dir is None:
        temp = Path(tempfile.mkdtemp(prefix=f"{name}-sim-certs-"))
        cert_dir = temp
    material = load_or_generate_tls_material(cert_dir)
    print(
        f"{name} simulator TLS material in {material.directory} (trust {material.ca_cert})",
        file=sys.stderr,
        flush=True,
    )
    return material.server_context, temp
