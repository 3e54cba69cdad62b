"""The frame codec shared by host and sandbox (mcp_sandbox_runtime.frames), over real sockets."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Kind

# Bounds a writer thread that should have finished long before; never waited on when all is well.
WRITER_JOIN_SECONDS = 30.0

BODY: dict[str, Any] = {"id": 7, "ok": True, "text": "héllo ✓ 🐍", "none": None, "nested": {"list": [1, 2.5, "x"]}}


def header(
    *,
    magic: bytes = frames.MAGIC,
    version: int = frames.PROTOCOL_VERSION,
    kind: int = Kind.DONE,
    length: int,
) -> bytes:
    return frames.HEADER.pack(magic, version, kind, length)


def raw_frame(payload: bytes, **fields: Any) -> bytes:
    return header(length=len(payload), **fields) + payload


def read_stream(data: bytes, *, max_size: int = frames.DEFAULT_MAX_FRAME) -> list[tuple[Kind, dict[str, Any]] | None]:
    """Write ``data`` into a socketpair from a thread, then end the stream; read frames up to EOF.

    Returns every read_frame result, the final ``None`` included. The writer thread ends its side
    whatever happens, and the reader's side is shut down on the way out, so neither blocks forever.
    """
    reader, writer = socket.socketpair()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[writer.send(view) :]
        except OSError as exc:  # reported to the test below, not lost in the thread
            failures.append(exc)
        finally:
            writer.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=write, name="frame-writer", daemon=True)
    results: list[tuple[Kind, dict[str, Any]] | None] = []
    with reader, writer:
        thread.start()
        try:
            while True:
                results.append(frame := frames.read_frame(reader.fileno(), max_size))
                if frame is None:
                    break
        finally:
            reader.shutdown(socket.SHUT_RDWR)  # unblocks the writer if reading stopped early
            thread.join(WRITER_JOIN_SECONDS)
    assert not thread.is_alive(), "the writer thread did not finish"
    assert failures == []
    return results


def round_trip_with_write_frame(kind: Kind, body: dict[str, Any]) -> tuple[Kind, dict[str, Any]] | None:
    """Send one frame with write_frame from a thread, read it with read_frame."""
    reader, writer = socket.socketpair()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            frames.write_frame(writer.fileno(), kind, body)
        except OSError as exc:
            failures.append(exc)
        finally:
            writer.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=write, name="frame-writer", daemon=True)
    with reader, writer:
        thread.start()
        try:
            received = frames.read_frame(reader.fileno())
            after = frames.read_frame(reader.fileno())
        finally:
            reader.shutdown(socket.SHUT_RDWR)
            thread.join(WRITER_JOIN_SECONDS)
    assert not thread.is_alive(), "the writer thread did not finish"
    assert failures == []
    assert after is None
    return received


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(Kind), ids=lambda kind: kind.name)
def test_a_frame_of_every_kind_survives_a_round_trip(kind: Kind) -> None:
    assert round_trip_with_write_frame(kind, BODY) == (kind, BODY)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda kind: kind.name)
def test_encode_and_decode_are_inverse(kind: Kind) -> None:
    data = frames.encode(kind, BODY)

    parsed_kind, length = frames.parse_header(data[: frames.HEADER.size], frames.DEFAULT_MAX_FRAME)

    assert (parsed_kind, length) == (kind, len(data) - frames.HEADER.size)
    assert frames.decode_body(data[frames.HEADER.size :]) == BODY


def test_the_wire_format_is_magic_version_kind_and_big_endian_length() -> None:
    assert frames.encode(Kind.DONE, {"exitCode": 0}) == b'MSBX\x03\x03\x00\x00\x00\x0e{"exitCode":0}'


def test_an_empty_object_body_survives_a_round_trip() -> None:
    assert round_trip_with_write_frame(Kind.EXEC, {}) == (Kind.EXEC, {})


@pytest.mark.parametrize("mebibytes", [16, 40])
def test_a_body_of_many_mebibytes_survives_a_round_trip(mebibytes: int) -> None:
    body = {"code": "x" * (mebibytes << 20), "tail": "ü✓"}

    assert round_trip_with_write_frame(Kind.EXEC, body) == (Kind.EXEC, body)


def test_consecutive_frames_are_read_one_at_a_time() -> None:
    data = frames.encode(Kind.READY, {"n": 1}) + frames.encode(Kind.CALL, {"n": 2})

    assert read_stream(data) == [(Kind.READY, {"n": 1}), (Kind.CALL, {"n": 2}), None]


def test_a_clean_end_of_stream_reads_as_none() -> None:
    assert read_stream(b"") == [None]


def test_a_body_of_exactly_max_size_is_accepted() -> None:
    payload = b'{"a":"xyz"}'

    assert read_stream(raw_frame(payload), max_size=len(payload)) == [(Kind.DONE, {"a": "xyz"}), None]


# --- rejections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "max_size"),
    [
        pytest.param(raw_frame(b"{}", magic=b"MSBY"), frames.DEFAULT_MAX_FRAME, id="wrong-magic"),
        pytest.param(raw_frame(b"{}", magic=b"\x00" * 4), frames.DEFAULT_MAX_FRAME, id="zero-magic"),
        pytest.param(
            raw_frame(b"{}", version=frames.PROTOCOL_VERSION + 1), frames.DEFAULT_MAX_FRAME, id="newer-version"
        ),
        pytest.param(raw_frame(b"{}", version=0), frames.DEFAULT_MAX_FRAME, id="version-zero"),
        pytest.param(raw_frame(b"{}", kind=0), frames.DEFAULT_MAX_FRAME, id="kind-zero"),
        pytest.param(raw_frame(b"{}", kind=max(Kind) + 1), frames.DEFAULT_MAX_FRAME, id="kind-unknown"),
        pytest.param(raw_frame(b"{}", kind=255), frames.DEFAULT_MAX_FRAME, id="kind-255"),
        pytest.param(raw_frame(b'{"a":"xyzw"}'), 11, id="one-byte-over-max-size"),
        pytest.param(header(length=0xFFFFFFFF), frames.DEFAULT_MAX_FRAME, id="length-4-gib"),
        pytest.param(raw_frame(b"not json"), frames.DEFAULT_MAX_FRAME, id="not-json"),
        pytest.param(raw_frame(b""), frames.DEFAULT_MAX_FRAME, id="empty-body"),
        pytest.param(raw_frame(b'{"a": "\xff"}'), frames.DEFAULT_MAX_FRAME, id="invalid-utf8"),
        pytest.param(raw_frame(b'{"a": 1'), frames.DEFAULT_MAX_FRAME, id="unclosed-object"),
        pytest.param(raw_frame(b"[1, 2]"), frames.DEFAULT_MAX_FRAME, id="json-array"),
        pytest.param(raw_frame(b'"text"'), frames.DEFAULT_MAX_FRAME, id="json-string"),
        pytest.param(raw_frame(b"null"), frames.DEFAULT_MAX_FRAME, id="json-null"),
        pytest.param(raw_frame(b"42"), frames.DEFAULT_MAX_FRAME, id="json-number"),
        pytest.param(frames.encode(Kind.DONE, {})[:5], frames.DEFAULT_MAX_FRAME, id="truncated-header"),
        pytest.param(header(length=10), frames.DEFAULT_MAX_FRAME, id="header-without-body"),
        pytest.param(header(length=10) + b'{"a":', frames.DEFAULT_MAX_FRAME, id="truncated-body"),
        pytest.param(
            frames.encode(Kind.READY, {}) + frames.encode(Kind.DONE, {"n": 1})[:-1],
            frames.DEFAULT_MAX_FRAME,
            id="second-frame-truncated",
        ),
    ],
)
def test_a_malformed_frame_raises_frame_error(data: bytes, max_size: int) -> None:
    with pytest.raises(frames.FrameError):
        read_stream(data, max_size=max_size)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="nested-100000-deep"),
        pytest.param(b'{"a":' + b"1" * 5000 + b"}", id="integer-of-5000-digits"),
    ],
)
def test_a_body_json_cannot_parse_safely_raises_frame_error(payload: bytes) -> None:
    with pytest.raises(frames.FrameError):
        read_stream(raw_frame(payload))


def test_an_oversized_length_is_rejected_from_the_header_alone() -> None:
    with pytest.raises(frames.FrameError):
        frames.parse_header(header(length=1 << 30), max_size=1 << 20)


# --- FrameParser: frames out of pieces of any size ------------------------------------------------


def test_the_parser_returns_frames_fed_one_byte_at_a_time() -> None:
    data = frames.encode(Kind.READY, {"n": 1}) + frames.encode(Kind.EXEC, BODY)
    parser = frames.FrameParser()
    received = []
    for index in range(len(data)):
        parser.feed(data[index : index + 1])
        while (frame := parser.next()) is not None:
            received.append(frame)

    assert received == [(Kind.READY, {"n": 1}), (Kind.EXEC, BODY)]
    assert parser.buffered == 0


def test_the_parser_says_how_many_bytes_the_current_frame_still_needs() -> None:
    data = frames.encode(Kind.EXEC, {"code": "x" * 100})
    parser = frames.FrameParser()
    assert parser.wanted() == frames.HEADER.size

    parser.feed(data[:20])
    assert parser.next() is None
    assert parser.wanted() == len(data) - 20

    parser.feed(data[20:])
    assert parser.next() == (Kind.EXEC, {"code": "x" * 100})


def test_the_parser_rejects_an_oversized_frame_from_its_header() -> None:
    parser = frames.FrameParser(max_size=100)
    parser.feed(header(length=101))

    with pytest.raises(frames.FrameError):
        parser.next()


def test_a_stream_that_ends_inside_a_frame_is_a_frame_error_and_one_that_ends_between_frames_is_not() -> None:
    whole = frames.FrameParser()
    whole.feed(frames.encode(Kind.DONE, {}))
    assert whole.next() == (Kind.DONE, {})
    whole.check_end()

    cut = frames.FrameParser()
    cut.feed(frames.encode(Kind.DONE, {"exitCode": 0})[:-1])
    assert cut.next() is None
    with pytest.raises(frames.FrameError):
        cut.check_end()


def test_the_typescript_runner_speaks_the_same_protocol_version_and_kinds() -> None:
    source = (Path(frames.__file__).parents[2] / "typescript" / "frames.ts").read_text()
    assert f"export const PROTOCOL_VERSION = {frames.PROTOCOL_VERSION};" in source
    for kind in Kind:
        assert f"  {kind.name} = {kind.value}," in source


# --- typed frames: one class per kind, the same bytes on the wire ----------------------------------

_EXEC = frames.Exec(
    run=3, code="print(1)", servers=("time",), env={"A": "b"}, max_images=4, max_image_bytes=5, last=False
)
# Each typed frame and the exact body the protocol has always carried for it (frames.ts speaks it).
TYPED = [
    pytest.param(frames.Ready("python", "3.11.2"), b'{"runtime":"python","version":"3.11.2"}', id="ready"),
    pytest.param(
        frames.Ready("python", "3.11.2", None, True, 7, ("numpy",), {"pandas": "ImportError: no"}, "threads"),
        b'{"runtime":"python","version":"3.11.2","zygote":true,"pid":7,"preloaded":["numpy"],'
        b'"failed":{"pandas":"ImportError: no"},"problem":"threads"}',
        id="ready-zygote",
    ),
    pytest.param(
        frames.Ready("bun", "1.2", language="typescript"),
        b'{"runtime":"bun","version":"1.2","language":"typescript"}',
        id="ready-typescript",
    ),
    pytest.param(
        _EXEC,
        b'{"run":3,"code":"print(1)","servers":["time"],"env":{"A":"b"},"maxImages":4,"maxImageBytes":5,"last":false}',
        id="exec",
    ),
    pytest.param(
        frames.Exec(3, "1", (), {}, 0, 0, True, cpu_seconds=9, guard="AAAA"),
        b'{"run":3,"code":"1","servers":[],"env":{},"maxImages":0,"maxImageBytes":0,"last":true,'
        b'"cpuSeconds":9,"guard":"AAAA"}',
        id="exec-to-a-zygote",
    ),
    pytest.param(
        frames.Exec(3, "1", (), {}, 0, 0, False, file_size=65536),
        b'{"run":3,"code":"1","servers":[],"env":{},"maxImages":0,"maxImageBytes":0,"last":false,"fileSize":65536}',
        id="exec-with-the-quota-left",
    ),
    pytest.param(frames.Done(3, 1, "KeyError"), b'{"run":3,"exitCode":1,"exception":"KeyError"}', id="done"),
    pytest.param(
        frames.Call(2, {"server": "time", "op": "list_tools"}),
        b'{"server":"time","op":"list_tools","id":2}',
        id="call",
    ),
    pytest.param(frames.Reply(2, {"x": [1]}), b'{"ok":true,"result":{"x":[1]},"id":2}', id="reply"),
    pytest.param(
        frames.Reply(2, error=frames.Failure("denied", "no", "time")),
        b'{"ok":false,"error":{"kind":"denied","message":"no","server":"time"},"id":2}',
        id="reply-failed",
    ),
    pytest.param(frames.Error("bad"), b'{"message":"bad"}', id="error"),
    pytest.param(frames.Display(3, "image/png", "iVBO"), b'{"run":3,"mime":"image/png","data":"iVBO"}', id="display"),
    pytest.param(frames.Exited(3, 137, None), b'{"run":3,"exitCode":137,"problem":null}', id="exited"),
]


@pytest.mark.parametrize(("frame", "wire"), TYPED)
def test_a_typed_frame_packs_to_the_protocols_bytes_and_decodes_back(frame: frames.Frame, wire: bytes) -> None:
    packed = frames.pack(frame)

    assert packed[frames.HEADER.size :] == wire
    parser = frames.FrameParser()
    parser.feed(packed)
    raw = parser.next()
    assert raw is not None and raw[0] is frame.KIND
    assert frames.decode(*raw) == frame


def test_a_field_absent_from_an_exec_frame_is_its_default() -> None:
    assert frames.decode(Kind.EXEC, {"code": "1"}) == frames.Exec(0, "1", (), {}, 0, 0, False)


def test_a_typed_frame_is_immutable_has_slots_and_equals_only_its_own_kind() -> None:
    done = frames.Done(1, 0, None)

    with pytest.raises(AttributeError):
        done.run = 2  # type: ignore[misc]
    assert not hasattr(done, "__dict__")
    assert done == frames.Done(1, 0, None) and hash(done) == hash(frames.Done(1, 0, None))
    exited: object = frames.Exited(1, 0, None)  # the same values, another kind
    assert done != exited
    assert repr(done) == "Done(run=1, exit_code=0, exception=None, fork=None)"


def test_a_forks_fields_travel_in_exec_and_done_and_a_malformed_report_is_refused() -> None:
    exec_frame = frames.Exec(3, "x", (), {}, 0, 0, False, state=123_456, snapshot=1 << 20, mapped=True)
    done = frames.Done(3, 0, None, frames.Forked(2, 5, ("g (TypeError: cannot pickle 'generator' object)",)))

    assert frames.decode(Kind.EXEC, exec_frame.encode()) == exec_frame
    assert frames.decode(Kind.DONE, done.encode()) == done
    malformed: list[object] = [
        [],
        {"variables": -1, "modules": 0, "skipped": []},
        {"variables": 1, "modules": 0, "skipped": [1]},
    ]
    for fork in malformed:
        with pytest.raises(frames.FrameError):
            frames.decode(Kind.DONE, {"run": 3, "exitCode": 0, "exception": None, "fork": fork})


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        pytest.param(Kind.EXEC, {"code": "1", "servers": ["not an alias"]}, id="exec-bad-alias"),
        pytest.param(Kind.EXEC, {"code": "1", "env": {"A=B": "c"}}, id="exec-bad-env-name"),
        pytest.param(Kind.EXEC, {"code": "1", "run": -1}, id="exec-negative-run"),
        pytest.param(Kind.EXEC, {"code": "1", "cpuSeconds": True}, id="exec-cpu-seconds-a-boolean"),
        pytest.param(Kind.EXEC, {"code": "1", "guard": 5}, id="exec-guard-a-number"),
        pytest.param(Kind.EXEC, {"code": "1", "state": True}, id="exec-state-not-a-size"),
        pytest.param(Kind.EXEC, {"code": "1", "state": 5, "mapped": 1}, id="exec-mapped-not-a-boolean"),
        pytest.param(Kind.READY, {"runtime": "python", "version": "3", "preloaded": "numpy"}, id="ready-preloaded"),
        pytest.param(Kind.READY, {"runtime": "python", "version": "3", "failed": {"x": 1}}, id="ready-failed"),
        pytest.param(Kind.REPLY, {"id": 1, "ok": False, "error": {"kind": "denied"}}, id="reply-no-message"),
        pytest.param(Kind.EXITED, {"run": 1, "exitCode": "0", "problem": None}, id="exited-exit-code"),
    ],
)
def test_decoding_a_frame_checks_every_fields_type(kind: Kind, body: dict[str, Any]) -> None:
    with pytest.raises(frames.FrameError):
        frames.decode(kind, body)


def test_the_runner_and_the_host_name_the_same_tools_mount() -> None:
    from mcp_sandbox.runners.python import mcp_sandbox_runtime
    from mcp_sandbox.sandbox.policy import TOOLS_MOUNT

    assert mcp_sandbox_runtime.TOOLS_MOUNT == TOOLS_MOUNT
