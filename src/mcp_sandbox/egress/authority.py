"""The egress proxy's ephemeral certificate authority: leaves for the hosts a secret goes to, and the upstream check.

To put a secret into a request, the proxy has to read the request: for a host with a secret
it terminates the sandbox's TLS with a leaf certificate made for that host, signed by a CA made
when the server starts (ECDSA P-256, valid for a day, replaced by the next one an hour before it
ends; bundles hold both, so a run that spans the change keeps trusting its leaves). The CAs' keys
and the leaves' key exist only in this process's memory; the sandbox trusts the certificates
(:meth:`Authority.bundle`). Upstream, the proxy opens TLS of its own, checked against the host's
roots and ``egress_upstream_ca``, resumes its sessions (:attr:`Authority.sessions`) and keeps its
idle connections (:attr:`Authority.pool`).

``cryptography`` makes the keys and certificates (the project's library for them) and the
standard :mod:`ssl` speaks TLS (through anyio's ``TLSStream``); no TLS-intercepting library fits
an anyio proxy that already owns its connections. :mod:`ssl` loads a certificate chain only from
a path, so a leaf's PEM goes through an anonymous memory file (``memfd_create``), never a disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import threading
import uuid
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcp_sandbox.egress.pool import Pool
from mcp_sandbox.egress.terminate import Sessions

__all__ = ["CA_NAME", "Authority", "system_roots"]

CA_NAME = "mcp-sandbox egress CA"
_CA_LIFE = datetime.timedelta(days=1)
_RENEW_BEFORE = datetime.timedelta(hours=1)
_SKEW = datetime.timedelta(minutes=5)
_ALPN = ["http/1.1"]  # the proxy reads HTTP/1.1 only: h2 is not offered on either side


def system_roots() -> bytes:
    """The host's CA bundle (what OpenSSL's default file holds), or nothing where there is none."""
    for candidate in (ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate:
            try:
                return Path(candidate).read_bytes()
            except OSError:
                continue
    return b""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _make_ca(ends: datetime.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA's key and self-signed certificate, valid from now until ``ends``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"{CA_NAME} {uuid.uuid4().hex[:8]}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mcp-sandbox"),
        ]
    )
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - _SKEW)
        .not_valid_after(ends)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


class Authority:
    """The CA of one server start; its leaves, one per host, cached until shortly before they end."""

    def __init__(self, upstream_ca: Path | None = None) -> None:
        """``upstream_ca``: a PEM bundle trusted for upstreams besides the host's roots (``egress_upstream_ca``).

        Raises:
            OSError, ssl.SSLError: ``upstream_ca`` cannot be read or holds no certificate.
        """
        self._lock = threading.Lock()
        self._upstream = ssl.create_default_context()
        if upstream_ca is not None:
            self._upstream.load_verify_locations(cafile=str(upstream_ca))
        self._upstream.set_alpn_protocols(_ALPN)
        self.sessions = Sessions()
        self.pool = Pool()
        self._leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = {}
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        self._key, self.certificate = _make_ca(now + _CA_LIFE)
        # The next CA, trusted already (in every bundle written from now on): a run that started
        # before the renewal still trusts the leaves made after it.
        self._next = _make_ca(now + 2 * _CA_LIFE)

    def renew(self) -> None:
        """Make the next CA the current one (done by itself an hour before the current one ends)."""
        with self._lock:
            self._replace()

    def _replace(self) -> None:
        self._key, self.certificate = self._next
        self._next = _make_ca(_now() + 2 * _CA_LIFE)
        self._leaves.clear()

    @property
    def pem(self) -> bytes:
        """The current CA's certificate (public)."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def trusted(self) -> bytes:
        """The certificates the sandbox trusts: the current CA's and the next one's."""
        return self.pem + self._next[1].public_bytes(serialization.Encoding.PEM)

    def bundle(self) -> bytes:
        """The host's roots and :meth:`trusted`: the sandbox's trust bundle."""
        roots = system_roots()
        return roots + (b"" if not roots or roots.endswith(b"\n") else b"\n") + self.trusted()

    def upstream_context(self) -> ssl.SSLContext:
        """The client context of the proxy's own TLS to an upstream: the host's roots and ``egress_upstream_ca``."""
        return self._upstream

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server context presenting a leaf for ``host`` (a normalised name or address), cached per host.

        Raises:
            OSError: no memory file could hold the leaf.
        """
        with self._lock:
            now = _now()
            if self.certificate.not_valid_after_utc - now < _RENEW_BEFORE:
                self._replace()
            cached = self._leaves.get(host)
            if cached is not None and cached[1] - now > _RENEW_BEFORE:
                return cached[0]
            context, ends = self._leaf(host, now)
            self._leaves[host] = (context, ends)
            return context

    def _leaf(self, host: str, now: datetime.datetime) -> tuple[ssl.SSLContext, datetime.datetime]:
        ends = self.certificate.not_valid_after_utc
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.certificate.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(ends)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(_ALPN)
        context.num_tickets = 1  # for clients that resume (node's agents); most sandboxed clients never do
        fd = os.memfd_create("egress-leaf", os.MFD_CLOEXEC)
        try:
            # The leaf alone: the sandbox has the CA, and a chain sent with it is only parsed again.
            os.write(fd, leaf.public_bytes(serialization.Encoding.PEM) + key)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return context, ends
