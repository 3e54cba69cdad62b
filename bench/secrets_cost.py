"""What a secret costs an HTTPS request: through the proxy's rule (TLS ended and re-opened) against a blind tunnel.

The egress proxy of one run serves on a Unix socket in this process; a client thread sends, per
request, ``CONNECT``, a TLS handshake and one ``GET`` of a 2-byte page to an HTTPS server of the
benchmark's own on loopback (its certificate from a CA made here, given as
``egress_upstream_ca``), each on a new connection, interleaved:

- tunnel: a grant without secrets (the proxy as it was);
- tunnel+secrets: a grant with a secret, to a host it does not go to (still a blind tunnel);
- rule: to the secret's host (a leaf of the proxy's CA, cached after the first request; the
  proxy's own TLS connection to the server kept from the previous request, as the client's
  ``Connection: close`` is not passed on; the header set; the answer scrubbed and re-framed);
- rule, host closes: the same, but the server closes each connection (``/close``), so the proxy
  opens its own TLS every time, resuming its last session;
- tunnel, resumed and rule, resumed: the same, by a client that resumes its own TLS session (as
  node's agents do; Python's clients do not).

Each kind has one proxy (as a run has) serving all its requests. Then the same on one
connection kept open per kind (``tunnel, kept`` and ``rule, kept``), as SDKs with a connection
pool send them: the rule's cost without its handshakes.

Medians and p95 in milliseconds of the client's request, the median CPU time the process spent
on it (client, proxy and server are all this process: the CPU figure is the one a loaded
machine disturbs least), the part of it in the event loop's thread (the proxy's own), and the
rule's added medians. Nothing is asserted; absolute numbers
drift +-30% between runs on a shared 2-core machine.

Run: `.venv/bin/python bench/secrets_cost.py [--requests N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import http.server
import socket
import ssl
import statistics
import tempfile
import threading
import time
from pathlib import Path

import anyio
import anyio.to_thread
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcp_sandbox import load_settings
from mcp_sandbox.egress import Authority, EgressGrant, hosts_resolver, serve_egress
from mcp_sandbox.egress.listener import SOCKET_NAME
from mcp_sandbox.engine.startup import tenant_egress
from mcp_sandbox.workspace import remove_tree

_PLAIN, _RULE = "plain.bench.test", "secret.bench.test"


class _Page(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # its head and body are two writes

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        if self.path == "/close" or self.close_connection:  # asked for, or the client's Connection: close
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for both names, signed by it: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _PLAIN)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(_PLAIN), x509.DNSName(_RULE)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _request(
    socket_path: Path,
    host: str,
    port: int,
    context: ssl.SSLContext,
    sessions: dict[str, ssl.SSLSession] | None,
    path: str = "/",
) -> float:
    """One request for ``path`` on a new connection through the proxy, as a one-shot client; its time in ms.

    ``sessions``: the client's TLS session per host, resumed and kept (as node's agents do); None: none.
    """
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(socket_path))
        raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += raw.recv(4096)
        if not answer.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"{host}: {answer!r}")
        session = sessions.get(host) if sessions is not None else None
        with context.wrap_socket(raw, server_hostname=host, session=session) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            body = b""
            while chunk := tls.recv(4096):
                body += chunk
            if sessions is not None and not tls.session_reused and tls.session is not None:
                sessions[host] = tls.session
    if not body.startswith(b"HTTP/1.1 200") or b"\r\n\r\n" not in body or b"ok" not in body.split(b"\r\n\r\n", 1)[1]:
        raise SystemExit(f"{host}: {body!r}")
    return (time.perf_counter() - started) * 1000


def _connect(socket_path: Path, host: str, port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(socket_path))
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(4096)
    return context.wrap_socket(raw, server_hostname=host)


def _kept_request(tls: ssl.SSLSocket, host: str) -> float:
    """One request on a connection kept open; its time in milliseconds."""
    started = time.perf_counter()
    tls.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answer = http.client.HTTPResponse(tls)
    answer.begin()
    if answer.status != 200 or answer.read() != b"ok":
        raise SystemExit(f"{host}: {answer.status}")
    return (time.perf_counter() - started) * 1000


async def _measure_kept(
    runs: Path, grant: EgressGrant, authority: Authority, port: int, requests: int, ca: Path
) -> dict[str, list[float]]:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_verify_locations(cadata=authority.pem.decode())
    resolver = hosts_resolver({_PLAIN: ["127.0.0.1"], _RULE: ["127.0.0.1"]})
    times: dict[str, list[float]] = {"tunnel, kept": [], "rule, kept": []}
    async with serve_egress(runs, grant, None, resolver=resolver, authority=authority) as (_proxy, directory):
        path = directory / SOCKET_NAME
        tunnel = await anyio.to_thread.run_sync(_connect, path, _PLAIN, port, context)
        rule = await anyio.to_thread.run_sync(_connect, path, _RULE, port, context)
        with tunnel, rule:
            for index in range(requests + 3):
                for kind, (tls, host) in {"tunnel, kept": (tunnel, _PLAIN), "rule, kept": (rule, _RULE)}.items():
                    took = await anyio.to_thread.run_sync(_kept_request, tls, host)
                    if index >= 3:
                        times[kind].append(took)
    return times


async def _measure(
    runs: Path, grants: dict[str, EgressGrant], authority: Authority, port: int, requests: int, ca: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_verify_locations(cadata=authority.pem.decode())
    resolver = hosts_resolver({_PLAIN: ["127.0.0.1"], _RULE: ["127.0.0.1"]})
    kinds = {"tunnel": (grants["none"], _PLAIN), "tunnel+secrets": (grants["secret"], _PLAIN)}
    kinds["rule"] = (grants["secret"], _RULE)
    kinds["rule, host closes"] = (grants["closes"], _RULE)  # another tenant: never its kept connections
    kinds["tunnel, resumed"] = (grants["none"], _PLAIN)  # the client resumes its TLS session
    kinds["rule, resumed"] = (grants["secret"], _RULE)
    sessions: dict[str, dict[str, ssl.SSLSession] | None] = dict.fromkeys(kinds)
    sessions.update({kind: {} for kind in kinds if kind.endswith("resumed")})
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu_times: dict[str, list[float]] = {kind: [] for kind in kinds}
    proxy_times: dict[str, list[float]] = {kind: [] for kind in kinds}  # the event loop's thread: the proxy
    async with contextlib.AsyncExitStack() as stack:
        sockets = {}
        for kind, (grant, _host) in kinds.items():
            served = serve_egress(runs, grant, None, resolver=resolver, authority=authority)
            _proxy, directory = await stack.enter_async_context(served)
            sockets[kind] = directory / SOCKET_NAME
        for index in range(requests + 3):
            for kind, (_grant, host) in kinds.items():
                cpu, proxy = time.process_time(), time.thread_time()
                path = "/close" if kind.endswith("closes") else "/"
                took = await anyio.to_thread.run_sync(
                    _request, sockets[kind], host, port, context, sessions[kind], path
                )
                if index >= 3:  # the first rounds make the leaf and warm the caches
                    times[kind].append(took)
                    cpu_times[kind].append((time.process_time() - cpu) * 1000)
                    proxy_times[kind].append((time.thread_time() - proxy) * 1000)
    return times, cpu_times, proxy_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    requests = parser.parse_args().requests
    parent = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    ca, cert, key = _certificates(parent)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            "BENCH_KEY": "sk-bench-0123456789abcdef",
            "MCP_SANDBOX_SECRET_BENCH": f'{{ value_from = "env:BENCH_KEY", hosts = ["{_RULE}"] }}',
            "MCP_SANDBOX_SECRET_CLOSES": f'{{ tenant = "closes", value_from = "env:BENCH_KEY", hosts = ["{_RULE}"] }}',
        }
        flags = {
            "state_dir": str(parent / "state"),
            "egress_allow": _PLAIN,
            "egress_allow_private": "127.0.0.1/32",
            "egress_ports": str(port),
            "egress_upstream_ca": str(ca),
        }
        egress = tenant_egress(load_settings(env=env, flags=flags))
        with_secret, closes = egress.grant("default", True, None), egress.grant("closes", True, None)
        without = tenant_egress(load_settings(env={}, flags=flags)).grant("default", True, None)
        assert with_secret is not None and closes is not None and without is not None
        authority = Authority(ca)
        runs = parent / "runs"
        runs.mkdir()
        grants = {"none": without, "secret": with_secret, "closes": closes}
        times, cpu, proxy = anyio.run(_measure, runs, grants, authority, port, requests, ca)
        kept = anyio.run(_measure_kept, runs, with_secret, authority, port, requests, ca)
    finally:
        server.shutdown()
        remove_tree(parent)
    print(f"HTTPS request through the egress proxy, {requests} each, a new connection each (ms)")
    for kind, values in times.items():
        p95 = sorted(values)[max(0, int(len(values) * 0.95) - 1)]
        used, proxied = statistics.median(cpu[kind]), statistics.median(proxy[kind])
        print(
            f"{kind:<17} median {statistics.median(values):6.2f}  p95 {p95:6.2f}"
            f"  CPU median {used:6.2f}  proxy CPU median {proxied:5.2f}"
        )
    added = statistics.median(times["rule"]) - statistics.median(times["tunnel"])
    added_cpu = statistics.median(cpu["rule"]) - statistics.median(cpu["tunnel"])
    added_proxy = statistics.median(proxy["rule"]) - statistics.median(proxy["tunnel"])
    print(
        f"rule adds {added:.2f} ms to the median request on a new connection"
        f" ({added_cpu:.2f} ms of CPU, all threads; {added_proxy:.2f} ms in the proxy)"
    )
    added = statistics.median(times["rule, host closes"]) - statistics.median(times["tunnel"])
    added_cpu = statistics.median(cpu["rule, host closes"]) - statistics.median(cpu["tunnel"])
    print(f"rule adds {added:.2f} ms ({added_cpu:.2f} ms of CPU) where the host closes each connection")
    added = statistics.median(times["rule, resumed"]) - statistics.median(times["tunnel, resumed"])
    added_proxy = statistics.median(proxy["rule, resumed"]) - statistics.median(proxy["tunnel, resumed"])
    print(
        f"rule adds {added:.2f} ms to the median request on a new connection whose client resumes"
        f" ({added_proxy:.2f} ms in the proxy)"
    )
    for kind, values in kept.items():
        p95 = sorted(values)[max(0, int(len(values) * 0.95) - 1)]
        print(f"{kind:<17} median {statistics.median(values):6.2f}  p95 {p95:6.2f}")
    added = statistics.median(kept["rule, kept"]) - statistics.median(kept["tunnel, kept"])
    print(f"rule adds {added:.2f} ms to the median request on a kept connection")


if __name__ == "__main__":
    main()
