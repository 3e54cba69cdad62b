"""The proxy's CA: a new one each start, whose leaves the previous start's trust refuses; scrubbing across chunks."""

from __future__ import annotations

import ssl
import subprocess
import sys

import pytest

from mcp_sandbox.config import SecretSpec, SecretValue
from mcp_sandbox.egress.authority import Authority
from mcp_sandbox.egress.secrets import Scrubber, bind


def handshake(server: ssl.SSLContext, trusted: bytes, host: str) -> None:
    """A TLS handshake in memory: a client trusting only ``trusted`` against ``server``'s leaf for ``host``."""
    client = ssl.create_default_context(cadata=trusted.decode())
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(to_client, to_server, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(to_server.read())
        to_client.write(s_out.read())
        try:
            c.do_handshake()
            s.do_handshake()
            return
        except ssl.SSLWantReadError:
            continue
    raise AssertionError("the handshake did not finish")


def test_a_leaf_is_trusted_by_its_start_and_not_by_the_next() -> None:
    first, second = Authority(), Authority()
    assert first.pem != second.pem
    leaf = first.server_context("api.web.test")
    assert first.server_context("api.web.test") is leaf  # cached per host
    handshake(leaf, first.pem, "api.web.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(leaf, second.trusted(), "api.web.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(leaf, first.pem, "other.test")  # a leaf names its host only


def test_the_bundle_holds_the_hosts_roots_and_the_ca() -> None:
    authority = Authority()
    bundle = authority.bundle()
    assert bundle.endswith(authority.trusted()) and authority.pem in bundle and bundle.count(b"BEGIN CERTIFICATE") > 2


def test_a_run_that_spans_the_cas_renewal_still_trusts_its_leaves() -> None:
    authority = Authority()
    trusted_before = authority.trusted()  # what a run started before the renewal has
    before = authority.pem
    authority.renew()
    assert authority.pem != before
    handshake(authority.server_context("api.web.test"), trusted_before, "api.web.test")
    handshake(authority.server_context("api.web.test"), authority.trusted(), "api.web.test")


def test_an_echo_split_across_chunks_is_scrubbed() -> None:
    value = "sk-" + "abcdefghijklmnop"
    spec = SecretSpec("api", "default", "env:X", ("a.test",), SecretValue(value))
    (bound,) = bind([(spec, ("a.test",))])
    scrubber = Scrubber([bound])
    stream = f"start {value} middle {value}".encode()
    pieces = [stream[i : i + 5] for i in range(0, len(stream), 5)]
    out = b"".join(scrubber.feed(piece) for piece in pieces) + scrubber.flush()
    assert out == f"start {bound.placeholder} middle {bound.placeholder}".encode()


def test_a_server_loads_the_authoritys_x509_only_when_asked_for_it() -> None:
    # A server whose tenants have no secret never makes a CA: a start without cryptography.x509
    # is about 60 ms of CPU shorter. Asking the package for Authority still gives it.
    script = (
        "import sys, mcp_sandbox.cli, mcp_sandbox.server.app, mcp_sandbox.engine, mcp_sandbox.egress.listener;"
        "before = 'cryptography.x509' in sys.modules;"
        "from mcp_sandbox.egress import Authority;"
        "print(before, Authority.__module__, 'cryptography.x509' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "mcp_sandbox.egress.authority", "True"]
