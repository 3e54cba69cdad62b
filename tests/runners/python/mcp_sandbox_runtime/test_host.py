"""The sandbox's side of code mode (mcp_sandbox_runtime.host and .api), in process, over a real socketpair.

The test plays the host on the other end of the socket with the shared frame codec: it reads the
CALL frames the runtime sends and answers with REPLY (or ERROR) frames, in whatever order it likes.
"""

from __future__ import annotations

import array
import base64
import contextlib
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import pytest

from downstream.fixture_server import tiny_png
from mcp_sandbox.runners.python.mcp_sandbox_runtime import api, frames, host
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Exec, Kind, Ready, Reply

pytestmark = pytest.mark.anyio

# Bounds every wait; none comes near it when all is well.
BOUND = 10.0

T = TypeVar("T")
Answer = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class Link:
    """A HostConnection on one end of a socketpair, and the host's end of it."""

    connection: host.HostConnection
    sandbox: socket.socket
    host_end: socket.socket
    received: list[dict[str, Any]] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def receive(self) -> tuple[Kind, dict[str, Any]]:
        """The next frame the sandbox sent (bounded)."""
        ready, _, _ = select.select([self.host_end], [], [], BOUND)
        assert ready, f"no frame from the sandbox within {BOUND} s"
        frame = frames.read_frame(self.host_end.fileno())
        assert frame is not None, "the sandbox closed the channel"
        return frame

    def send(self, kind: Kind, body: dict[str, Any]) -> None:
        frames.write_frame(self.host_end.fileno(), kind, body)

    def serve(self, answer: Answer) -> None:
        """Answer every CALL with ``answer(body)`` (plus its id), from a thread, until the channel ends."""

        def run() -> None:
            try:
                while (frame := frames.read_frame(self.host_end.fileno())) is not None:
                    kind, body = frame
                    assert kind is Kind.CALL, kind
                    self.received.append(body)
                    self.send(Kind.REPLY, {**answer(body), "id": body["id"]})
            except BaseException as exc:  # reported by the fixture, not lost in the thread
                self.failures.append(exc)

        thread = threading.Thread(target=run, name="test-host", daemon=True)
        self.threads.append(thread)
        thread.start()

    def close(self) -> None:
        # Shutting both ends down wakes every thread blocked reading either; then the fds can go.
        for end in (self.sandbox, self.host_end):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        reader = self.connection._reader
        for thread in [*self.threads, *([reader] if reader is not None else [])]:
            thread.join(BOUND)
            assert not thread.is_alive(), f"{thread.name} did not end"
        self.connection.close()
        self.sandbox.close()
        self.host_end.close()
        if self.failures:
            raise self.failures[0]


@contextlib.contextmanager
def open_link(connect: Callable[[int], host.HostConnection]) -> Iterator[Link]:
    sandbox, host_end = socket.socketpair()
    link = Link(connect(sandbox.fileno()), sandbox, host_end)
    try:
        yield link
    finally:
        link.close()


@pytest.fixture
def link() -> Iterator[Link]:
    with open_link(host.HostConnection) as opened:
        yield opened


@pytest.fixture
def restore_connection() -> Iterator[None]:
    saved = host._connection
    try:
        yield
    finally:
        host._connection = saved


@pytest.fixture
def connected(restore_connection: None) -> Iterator[Link]:
    """The module-level connection (what ``api`` uses), made with ``host.connect``."""
    with open_link(host.connect) as opened:
        assert host.connection() is opened.connection
        yield opened


def start(function: Callable[[], T]) -> Future[T]:
    """Run a blocking call in a thread; its future holds the outcome."""
    outcome: Future[T] = Future()

    def run() -> None:
        try:
            outcome.set_result(function())
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, name="test-call", daemon=True).start()
    return outcome


def bounded(function: Callable[[], T]) -> T:
    """Run a blocking call in a thread and wait for it at most BOUND seconds."""
    return start(function).result(timeout=BOUND)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- HostConnection -------------------------------------------------------------------------------


def test_requests_get_increasing_ids_and_replies_are_matched_by_id_out_of_order(link: Link) -> None:
    futures = [link.connection.request(op, {"n": n}) for n, op in enumerate(["first", "second", "third"])]
    received = [link.receive() for _ in futures]
    assert received == [
        (Kind.CALL, {"n": 0, "op": "first", "id": 1}),
        (Kind.CALL, {"n": 1, "op": "second", "id": 2}),
        (Kind.CALL, {"n": 2, "op": "third", "id": 3}),
    ]
    link.send(Kind.REPLY, {"id": 99, "ok": True, "result": "for nobody"})  # ignored
    for _, body in reversed(received):
        link.send(Kind.REPLY, {"id": body["id"], "ok": True, "result": body["n"]})
    assert [future.result(timeout=BOUND) for future in futures] == [Reply(1, 0), Reply(2, 1), Reply(3, 2)]


def test_fifty_requests_from_threads_at_once_each_get_their_own_reply(link: Link) -> None:
    link.serve(lambda body: {"ok": True, "result": body["n"]})
    start = threading.Barrier(50, timeout=BOUND)

    def ask(n: int) -> Any:
        start.wait()
        return link.connection.request("echo", {"n": n}).result(timeout=BOUND).result

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(ask, range(50)))
    assert results == list(range(50))
    assert sorted(body["id"] for body in link.received) == list(range(1, 51))


def _close(link: Link) -> None:
    link.host_end.shutdown(socket.SHUT_WR)


def _error_frame(link: Link) -> None:
    link.send(Kind.ERROR, {"message": "the host is confused"})


def _garbage(link: Link) -> None:
    link.host_end.sendall(b"this is not a frame at all")


@pytest.mark.parametrize("end", [_close, _error_frame, _garbage], ids=["closed", "error-frame", "garbage"])
def test_when_the_channel_ends_every_pending_request_fails_and_later_ones_fail_at_once(
    link: Link, end: Callable[[Link], None]
) -> None:
    pending = [link.connection.request("slow", {"n": n}) for n in range(3)]
    assert [link.receive()[1]["id"] for _ in pending] == [1, 2, 3]
    end(link)
    for future in pending:
        with pytest.raises(host.HostUnavailable):
            future.result(timeout=BOUND)

    later = link.connection.request("after", {})
    assert later.done()
    with pytest.raises(host.HostUnavailable):
        later.result(timeout=0)


# --- api: results as sandboxed code sees them -----------------------------------------------------

SHAPES: list[tuple[str, dict[str, Any], Any]] = [
    ("structured-wins", {"structuredContent": {"temp": 21}, "content": [text("21 degrees")]}, {"temp": 21}),
    ("structured-null", {"structuredContent": None, "content": [text("plain")]}, "plain"),
    ("one-text", {"content": [text("hello")]}, "hello"),
    ("json-object-text", {"content": [text(' {"a": [1, 2]}\n')]}, {"a": [1, 2]}),
    ("json-array-text", {"content": [text('[1, "x"]')]}, [1, "x"]),
    ("broken-json-text", {"content": [text("{not json")]}, "{not json"),
    ("json-scalar-text", {"content": [text("42")]}, "42"),
    ("several-blocks", {"content": [text("one"), text('{"two": 2}')]}, ["one", {"two": 2}]),
    ("no-content", {"content": []}, None),
    ("unknown-block", {"content": [{"type": "hologram", "x": 1}]}, {"type": "hologram", "x": 1}),
    (
        "resource-text",
        {
            "content": [
                {"type": "resource", "resource": {"uri": "fixture://a.txt", "mimeType": "text/plain", "text": "hi"}}
            ]
        },
        api.Resource(uri="fixture://a.txt", mime_type="text/plain", text="hi"),
    ),
    (
        "resource-blob",
        {"content": [{"type": "resource", "resource": {"uri": "fixture://b.bin", "blob": b64(b"\x00\x01\xff")}}]},
        api.Resource(uri="fixture://b.bin", mime_type=None, blob=b"\x00\x01\xff"),
    ),
    (
        "resource-link",
        {
            "content": [
                {
                    "type": "resource_link",
                    "uri": "file:///data/report.csv",
                    "name": "report",
                    "description": "the report",
                    "mimeType": "text/csv",
                }
            ]
        },
        api.ResourceLink(uri="file:///data/report.csv", name="report", description="the report", mime_type="text/csv"),
    ),
    (
        "audio",
        {"content": [{"type": "audio", "mimeType": "audio/wav", "data": b64(b"RIFF....")}]},
        api.Media(kind="audio", mime_type="audio/wav", data=b"RIFF...."),
    ),
]


@pytest.mark.parametrize(("result", "expected"), [shape[1:] for shape in SHAPES], ids=[shape[0] for shape in SHAPES])
def test_call_tool_sync_shapes_the_result(connected: Link, result: dict[str, Any], expected: Any) -> None:
    connected.serve(lambda body: {"ok": True, "result": result})
    assert bounded(lambda: api.call_tool_sync("fixture", "tool", {"x": 1})) == expected


def test_a_call_sends_the_server_tool_and_arguments(connected: Link) -> None:
    connected.serve(lambda body: {"ok": True, "result": {"content": []}})
    bounded(lambda: api.call_tool_sync("fixture", "echo", {"text": "hi"}))
    bounded(lambda: api.call_tool_sync("Other Server", "pid"))
    assert connected.received == [
        {"op": "call_tool", "id": 1, "server": "fixture", "tool": "echo", "arguments": {"text": "hi"}},
        {"op": "call_tool", "id": 2, "server": "Other Server", "tool": "pid", "arguments": {}},
    ]


def test_an_image_is_media_with_its_decoded_bytes_that_saves_to_a_file(connected: Link, tmp_path: Path) -> None:
    png = tiny_png()
    connected.serve(
        lambda body: {"ok": True, "result": {"content": [{"type": "image", "mimeType": "image/png", "data": b64(png)}]}}
    )
    media = bounded(lambda: api.call_tool_sync("fixture", "image"))
    assert isinstance(media, api.Media)
    assert (media.kind, media.mime_type, media.data) == ("image", "image/png", png)
    target = tmp_path / "red.png"
    assert media.save(target) == target
    assert target.read_bytes() == png


@pytest.mark.parametrize(
    ("resource", "content"),
    [({"text": "héllo ✓\n"}, "héllo ✓\n".encode()), ({"blob": b64(b"\x00\xff")}, b"\x00\xff")],
    ids=["text", "blob"],
)
def test_an_embedded_resource_saves_its_content(
    connected: Link, tmp_path: Path, resource: dict[str, Any], content: bytes
) -> None:
    block = {"type": "resource", "resource": {"uri": "fixture://r", **resource}}
    connected.serve(lambda body: {"ok": True, "result": {"content": [block]}})
    shaped = bounded(lambda: api.call_tool_sync("fixture", "resource"))
    assert isinstance(shaped, api.Resource)
    shaped.save(tmp_path / "r")
    assert (tmp_path / "r").read_bytes() == content


def test_raw_gives_structured_content_and_every_block(connected: Link) -> None:
    result = {"structuredContent": {"a": 1}, "content": [text('{"b": 2}'), text("plain")]}
    connected.serve(lambda body: {"ok": True, "result": result})
    raw = bounded(lambda: api.call_tool_sync("fixture", "tool", raw=True))
    assert raw == {"structuredContent": {"a": 1}, "content": [{"b": 2}, "plain"]}


@pytest.mark.parametrize("kind", ["tool", "denied", "unavailable", "invalid"])
def test_a_refused_call_raises_mcperror_with_kind_server_tool_and_message(connected: Link, kind: str) -> None:
    error = {"kind": kind, "message": "it went wrong", "server": "Fixture Server"}
    connected.serve(lambda body: {"ok": False, "error": error})
    with pytest.raises(api.MCPError) as caught:
        bounded(lambda: api.call_tool_sync("fixture", "echo", {"text": "x"}))
    assert (caught.value.kind, caught.value.server, caught.value.tool, caught.value.message) == (
        kind,
        "Fixture Server",
        "echo",
        "it went wrong",
    )


def test_an_error_without_a_server_names_the_server_called(connected: Link) -> None:
    connected.serve(lambda body: {"ok": False, "error": {"kind": "invalid", "message": "bad"}})
    with pytest.raises(api.MCPError) as caught:
        bounded(lambda: api.call_tool_sync("fixture", "echo"))
    assert (caught.value.kind, caught.value.server, caught.value.tool) == ("invalid", "fixture", "echo")


def test_a_call_when_the_host_closes_the_channel_raises_mcperror_unavailable(connected: Link) -> None:
    calling = start(lambda: api.call_tool_sync("fixture", "echo"))
    assert connected.receive()[1]["op"] == "call_tool"  # the call is in flight
    connected.host_end.shutdown(socket.SHUT_WR)
    with pytest.raises(api.MCPError) as caught:
        calling.result(timeout=BOUND)
    assert (caught.value.kind, caught.value.server, caught.value.tool) == ("unavailable", "fixture", "echo")


def test_without_a_host_every_request_raises_mcperror_unavailable(restore_connection: None) -> None:
    host._connection = None
    with pytest.raises(api.MCPError) as caught:
        api.call_tool_sync("fixture", "echo")
    assert caught.value.kind == "unavailable"
    with pytest.raises(api.MCPError) as listing:
        api.list_servers()
    assert listing.value.kind == "unavailable"


def test_the_helpers_send_their_requests_and_return_the_result(connected: Link) -> None:
    listing = ("list_servers", "list_tools")  # their answers are lists (also awaitable)

    def answer(op: str) -> Any:
        return [f"answer to {op}"] if op in listing else f"answer to {op}"

    connected.serve(lambda body: {"ok": True, "result": answer(body["op"])})
    calls: list[tuple[Callable[[], Any], dict[str, Any]]] = [
        (api.list_servers, {"op": "list_servers"}),
        (api.discovered_server_entries, {"op": "discovered_servers"}),
        (lambda: api.describe_server("fixture"), {"op": "describe_server", "server": "fixture"}),
        (lambda: api.list_tools("fixture"), {"op": "list_tools", "server": "fixture", "schemas": False}),
        (
            lambda: api.search_tools("weather", detail="name", limit=3),
            {"op": "search_tools", "query": "weather", "detail": "name", "limit": 3},
        ),
        (
            lambda: api.query_tool_docs("fixture", "echo", detail="full"),
            {"op": "query_tool_docs", "server": "fixture", "tool": "echo", "detail": "full"},
        ),
    ]
    for helper, expected in calls:
        assert bounded(helper) == answer(expected["op"])
    assert [{key: value for key, value in body.items() if key != "id"} for body in connected.received] == [
        expected for _, expected in calls
    ]


# --- api in asyncio ---------------------------------------------------------------------------------


async def test_asyncio_tasks_awaiting_call_tool_together_each_get_their_own_result(connected: Link) -> None:
    count = 20

    def answer_in_reverse() -> None:
        bodies = [connected.receive()[1] for _ in range(count)]
        for body in reversed(bodies):
            reply = {"content": [text(body["arguments"]["text"])]}
            connected.send(Kind.REPLY, {"id": body["id"], "ok": True, "result": reply})

    results: dict[int, Any] = {}

    async def call(n: int) -> None:
        results[n] = await api.call_tool("fixture", "echo", {"text": f"call {n}"})

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            for n in range(count):
                group.start_soon(call, n)
            await anyio.to_thread.run_sync(answer_in_reverse)
    assert results == {n: f"call {n}" for n in range(count)}


async def test_call_tool_in_asyncio_shapes_raw_results_and_raises_mcperror(connected: Link) -> None:
    replies = iter(
        [
            {"ok": True, "result": {"structuredContent": {"result": 42}, "content": [text('{"result": 42}')]}},
            {"ok": True, "result": {"structuredContent": {"result": 42}, "content": [text('{"result": 42}')]}},
            {"ok": False, "error": {"kind": "denied", "message": "not in this run", "server": "other"}},
        ]
    )
    connected.serve(lambda body: next(replies))
    with anyio.fail_after(BOUND):
        assert await api.call_tool("fixture", "add", {"a": 40, "b": 2}) == {"result": 42}
        assert await api.call_tool("fixture", "add", {"a": 40, "b": 2}, raw=True) == {
            "structuredContent": {"result": 42},
            "content": [{"result": 42}],
        }
        with pytest.raises(api.MCPError) as caught:
            await api.call_tool("other", "echo")
    assert (caught.value.kind, caught.value.server, caught.value.tool) == ("denied", "other", "echo")


def test_image_data_that_is_not_base64_raises_mcperror_not_a_decoding_error(connected: Link) -> None:
    connected.serve(
        lambda body: {"ok": True, "result": {"content": [{"type": "image", "mimeType": "image/png", "data": "%%%"}]}}
    )
    with pytest.raises(api.MCPError) as caught:
        bounded(lambda: api.call_tool_sync("fixture", "image"))
    assert (caught.value.kind, caught.value.server, caught.value.tool) == ("invalid", "fixture", "image")


def test_a_frame_other_than_reply_does_not_consume_a_pending_request(connected: Link) -> None:
    # A DONE frame carrying a pending id is not an answer to it: the REPLY that follows is.
    pending = connected.connection.request("list_servers", {})
    _, body = connected.receive()
    connected.send(Kind.DONE, {"run": body["id"], "exitCode": 0, "exception": None, "id": body["id"]})
    connected.send(Kind.REPLY, {"id": body["id"], "ok": True, "result": 7})
    assert pending.result(BOUND) == Reply(body["id"], 7)


# --- frames for the runner: EXEC and its descriptors --------------------------------------------


def _send_with_fds(link: Link, data: bytes, fds: list[int]) -> None:
    sent = link.host_end.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if sent < len(data):
        link.host_end.sendall(data[sent:])


def test_an_exec_frame_comes_to_the_runner_with_the_descriptors_sent_with_it(link: Link) -> None:
    read_end, write_end = os.pipe()
    try:
        link.connection.start()  # reading while the big frame is written, as in the runner
        link.send(Kind.REPLY, {"id": 5, "ok": True})  # nobody waits for it: dropped
        _send_with_fds(link, frames.encode(Kind.EXEC, {"code": "x" * 300_000}), [write_end, write_end])
        command = bounded(link.connection.next_command)
        assert command is not None
        frame, fds = command
        exec_ = Exec(run=0, code="x" * 300_000, servers=(), env={}, max_images=0, max_image_bytes=0, last=False)
        assert (frame, len(fds)) == (exec_, 2)
        os.write(fds[1], b"via the runner's copy")
        assert os.read(read_end, 100) == b"via the runner's copy"
        host.close_fds(fds)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_frames_other_than_replies_are_handed_to_the_runner_in_order(link: Link) -> None:
    link.send(Kind.READY, {"runtime": "python", "version": "1"})
    link.send(Kind.EXEC, {"run": 2, "code": "2"})

    assert [bounded(link.connection.next_command) for _ in range(2)] == [
        (Ready("python", "1"), []),
        (Exec(run=2, code="2", servers=(), env={}, max_images=0, max_image_bytes=0, last=False), []),
    ]


def test_the_end_of_the_channel_is_the_end_of_the_runners_commands_for_good(link: Link) -> None:
    link.host_end.shutdown(socket.SHUT_WR)

    assert bounded(link.connection.next_command) is None
    assert bounded(link.connection.next_command) is None
    assert link.connection.failed is False


def test_garbage_from_the_host_is_answered_with_an_error_frame_and_ends_the_commands(link: Link) -> None:
    link.host_end.sendall(b"this is not a frame at all")

    assert bounded(link.connection.next_command) is None
    assert link.connection.failed is True
    assert link.receive()[0] is Kind.ERROR


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        pytest.param(Kind.EXEC, {"run": 1}, id="exec-without-code"),
        pytest.param(Kind.EXEC, {"code": "1", "maxImages": "2"}, id="exec-max-images-a-string"),
        pytest.param(Kind.REPLY, {"id": 1, "ok": "yes"}, id="reply-ok-a-string"),
        pytest.param(Kind.REPLY, {"id": 1, "ok": False, "error": "no"}, id="reply-error-a-string"),
    ],
)
def test_a_frame_from_the_host_with_a_field_of_the_wrong_type_ends_the_commands(
    link: Link, kind: Kind, body: dict[str, Any]
) -> None:
    link.send(kind, body)

    assert bounded(link.connection.next_command) is None
    assert link.connection.failed is True
    assert link.receive()[0] is Kind.ERROR


def test_a_reply_to_a_request_its_caller_gave_up_on_does_not_stop_the_reader(link: Link) -> None:
    abandoned = link.connection.request("slow", {})
    abandoned.cancel()
    _, body = link.receive()
    link.send(Kind.REPLY, {"id": body["id"], "ok": True, "result": "late"})
    link.serve(lambda body: {"ok": True, "result": "fresh"})

    assert link.connection.request("next", {}).result(BOUND).result == "fresh"
