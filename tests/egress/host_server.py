"""A test host's web servers, run inside a network namespace the egress tests create.

``host_server.py CERT KEY``: HTTP on port 80 and HTTPS (the certificate given, signed by the
tests' own CA) on port 443. ``GET /`` answers ``hello from <Host>``; ``GET /big`` sends 4 MiB;
``GET /keep-alive`` answers like ``/`` but leaves the connection open for the client's next
request (every other answer closes it). ``GET /auth`` answers the SHA-256 of the request's
``Authorization`` header (what arrived, without showing it); ``GET /echo`` echoes that header in
its body and in an ``X-Echo`` header (as a careless API echoes a key); ``GET /simple/demo/`` is a
package index's page for ``demo`` 1.0 (for pip). Kept connections (the egress proxy's pool):
``GET /peer`` answers the client's port (which connection it came on) and keeps the connection
(``?size=N`` pads the body to N bytes; ``/peer-auth`` adds the SHA-256 of ``Authorization``);
``HEAD /peer`` its head alone; ``GET /empty`` a 204; ``GET /drop`` answers like ``/peer`` and
then closes without saying so; ``GET /says-close`` says ``Connection: close`` and keeps the
connection open; ``GET /unframed`` answers without a length, its end the connection's.
Prints ``ready`` once both listen.
"""

from __future__ import annotations

import hashlib
import http.server
import ssl
import sys
import threading

BIG = 4 << 20


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:
        self._kept(head=True)

    def _kept(self, head: bool = False) -> None:
        """The answers on a connection the client may keep (see the module)."""
        path, _, query = self.path.partition("?")
        body = str(self.client_address[1]).encode()
        if path == "/peer-auth":
            body += b" " + hashlib.sha256(self.headers.get("Authorization", "").encode()).hexdigest().encode()
        if query.startswith("size="):
            body = body.ljust(int(query.removeprefix("size=")), b".")
        self.send_response(204 if path == "/empty" else 200)
        if path != "/unframed" and path != "/empty":
            self.send_header("Content-Length", str(len(body)))
        if path == "/says-close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = path in ("/drop", "/unframed") or (self.close_connection and path != "/says-close")
        if not head and path != "/empty":
            try:
                self.wfile.write(body)
            except OSError:
                pass  # the client went away

    def do_GET(self) -> None:
        if self.path.partition("?")[0] in ("/peer", "/peer-auth", "/empty", "/drop", "/says-close", "/unframed"):
            self._kept()
            return
        auth = self.headers.get("Authorization", "")
        if self.path == "/big":
            body = b"x" * BIG
        elif self.path == "/auth":
            body = hashlib.sha256(auth.encode()).hexdigest().encode()
        elif self.path == "/echo":
            body = f"you sent: {auth}".encode()
        elif self.path == "/simple/demo/":
            body = b'<a href="/files/demo-1.0.tar.gz">demo-1.0.tar.gz</a>'
        else:
            body = f"hello from {self.headers.get('Host')}".encode()
        self.send_response(200)
        if self.path == "/echo":
            self.send_header("X-Echo", auth)
        if self.path.startswith("/simple/"):
            self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        if self.path != "/keep-alive":
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # the proxy cut the download

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(cert: str, key: str) -> None:
    plain = http.server.ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    secure = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
