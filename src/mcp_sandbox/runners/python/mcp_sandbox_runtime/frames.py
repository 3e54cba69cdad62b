"""Typed frames between host and sandbox, shared by both sides (stdlib only).

Each kind's body is one typed class here (:class:`Ready`, :class:`Exec`, :class:`Done`,
:class:`Error`, :class:`Display`, :class:`Exited`, :class:`Verdict`; code mode's :class:`Call` and :class:`Reply`
in ``call_frames.py``, exported here too): ``encode()``
gives the wire body, ``decode(body)`` checks every field's type (``fields.py``) and raises
FrameError. Both sides send and receive these objects; :func:`pack` and :func:`decode` join them
to the codec (``wire.py``, which lays out a frame and its socket). The runtime serves any number
of EXEC frames, one at a time; ``run`` numbers them, and the DONE and DISPLAY frames of a run
carry its number. A zygote (``zygote.py``) forks a child per EXEC frame; that frame carries a
third descriptor, the run's own channel socket, on which the child speaks (CALL, DISPLAY, DONE)
while the zygote reports the child's end with EXITED on the first channel. An EXEC whose
``verdict`` is set (a resumed session's first run) is followed by a VERDICT for its run: the host
checks the state's seal while the runtime reads it, and the runtime loads nothing of the state
(nor runs the code) before a VERDICT that says ``ok``; any other answer ends the runtime.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .call_frames import Call, Failure, Reply
from .fields import code_of, int_of, optional_str_of, str_of, strings_of
from .records import record
from .wire import (
    DEFAULT_MAX_FRAME,
    HEADER,
    MAGIC,
    PROTOCOL_VERSION,
    FrameError,
    FrameParser,
    Kind,
    decode_body,
    encode,
    parse_header,
    read_frame,
    write_frame,
)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "HEADER",
    "MAGIC",
    "PROTOCOL_VERSION",
    "Call",
    "Display",
    "Done",
    "Error",
    "Exec",
    "Exited",
    "Failure",
    "Forked",
    "Frame",
    "FrameError",
    "FrameParser",
    "Kind",
    "Ready",
    "Reply",
    "Verdict",
    "decode",
    "decode_body",
    "encode",
    "pack",
    "parse_header",
    "read_frame",
    "write_frame",
]


@record(frozen=True, slots=True)
class Ready:
    """READY (sandbox to host): the runtime is up. A zygote adds what it preloaded, or why it cannot serve."""

    KIND: ClassVar[Kind] = Kind.READY
    runtime: str
    version: str
    language: str | None = None  # the TypeScript runner's language
    zygote: bool = False
    pid: int | None = None  # the zygote's pid
    preloaded: tuple[str, ...] | None = None  # the modules a zygote imported
    failed: dict[str, str] | None = None  # {module: why not} for the others
    problem: str | None = None  # why the zygote cannot serve runs

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"runtime": self.runtime, "version": self.version}
        if self.language is not None:
            body["language"] = self.language
        if self.zygote:
            body["zygote"] = True
        if self.pid is not None:
            body["pid"] = self.pid
        if self.preloaded is not None:
            body["preloaded"] = list(self.preloaded)
        if self.failed is not None:
            body["failed"] = dict(self.failed)
        if self.problem is not None:
            body["problem"] = self.problem
        return body

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Ready:
        zygote = body.get("zygote", False)
        if not isinstance(zygote, bool):
            raise FrameError("'zygote' must be a boolean")
        preloaded, failed = body.get("preloaded"), body.get("failed")
        if failed is not None and (
            not isinstance(failed, dict) or not all(isinstance(why, str) for why in failed.values())
        ):
            raise FrameError("'failed' must map module names to strings")
        return cls(
            runtime=str_of(body, "runtime"),
            version=str_of(body, "version"),
            language=optional_str_of(body, "language"),
            zygote=zygote,
            pid=int_of(body, "pid") if "pid" in body else None,
            preloaded=None if preloaded is None else strings_of(preloaded, "preloaded"),
            failed=failed,
            problem=optional_str_of(body, "problem"),
        )


@record(frozen=True, slots=True)
class Exec:
    """EXEC (host to sandbox): run ``code``; the frame carries the run's stdout and stderr pipes.

    ``servers`` are the aliases of the servers the run may call, ``env`` is added to the
    environment for the run, ``max_images``/``max_image_bytes`` cap its DISPLAY frames; after a
    ``last`` run the runtime exits. To a zygote it also carries the run's channel socket, the run's
    ``cpu_seconds`` and its seccomp ``guard`` (base64 BPF). ``max_call_bytes`` is the host's limit
    on a CALL body: the runtime fails a larger request itself (a larger frame would end the run).
    ``file_size`` is the run's ``RLIMIT_FSIZE`` (what its conversation's quota has left): a
    ``last`` run lowers its hard limit to it, a session's run its soft limit.
    ``state``: the frame carries a third descriptor, a read-only file whose first ``state`` bytes
    are a forked (or resumed) session's variables (opaque to the host), read whole and loaded
    before the code (with ``mapped``, their large buffers are mapped copy-on-write instead: a
    parked state the server keeps while the session lives, see ``snapshot.py``); ``snapshot`` (a
    byte budget) asks instead for this session's variables, written to the run's stdout as such
    a state (``fork.py``). ``verdict``: the state's seal is still being checked by the host; the
    runtime may read (or map) the state but loads nothing of it, nor runs the code, until a
    :class:`Verdict` for this run says ``ok``.
    A field absent on the wire is its default.
    """

    KIND: ClassVar[Kind] = Kind.EXEC
    run: int
    code: str
    servers: tuple[str, ...]
    env: dict[str, str]
    max_images: int
    max_image_bytes: int
    last: bool
    cpu_seconds: int | None = None
    guard: str | None = None
    max_call_bytes: int | None = None  # the host's limit on a CALL body: a larger request fails here
    file_size: int | None = None
    state: int | None = None
    snapshot: int | None = None
    mapped: bool = False
    verdict: bool = False

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "run": self.run,
            "code": self.code,
            "servers": list(self.servers),
            "env": dict(self.env),
            "maxImages": self.max_images,
            "maxImageBytes": self.max_image_bytes,
            "last": self.last,
        }
        if self.cpu_seconds is not None:
            body["cpuSeconds"] = self.cpu_seconds
        if self.guard is not None:
            body["guard"] = self.guard
        if self.max_call_bytes is not None:
            body["maxCallBytes"] = self.max_call_bytes
        if self.file_size is not None:
            body["fileSize"] = self.file_size
        if self.state is not None:
            body["state"] = self.state
        if self.snapshot is not None:
            body["snapshot"] = self.snapshot
        if self.mapped:
            body["mapped"] = True
        if self.verdict:
            body["verdict"] = True
        return body

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Exec:
        if not isinstance(body.get("code"), str):
            raise FrameError("an EXEC frame needs code")
        servers = body.get("servers", [])
        if not isinstance(servers, list) or not all(
            isinstance(alias, str) and alias.isidentifier() for alias in servers
        ):
            raise FrameError("EXEC servers must be a list of aliases")
        env = body.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
            for k, v in env.items()
        ):
            raise FrameError("EXEC env must map variable names to strings")
        last = body.get("last", False)
        if not isinstance(last, bool):
            raise FrameError("EXEC last must be a boolean")
        if not isinstance(body.get("mapped", False), bool):
            raise FrameError("EXEC mapped must be a boolean")
        if not isinstance(body.get("verdict", False), bool):
            raise FrameError("EXEC verdict must be a boolean")
        return cls(
            run=int_of(body, "run", 0),
            code=body["code"],
            servers=tuple(servers),
            env=env,
            max_images=int_of(body, "maxImages", 0),
            max_image_bytes=int_of(body, "maxImageBytes", 0),
            last=last,
            cpu_seconds=int_of(body, "cpuSeconds") if "cpuSeconds" in body else None,
            guard=str_of(body, "guard") if "guard" in body else None,
            max_call_bytes=int_of(body, "maxCallBytes") if "maxCallBytes" in body else None,
            file_size=int_of(body, "fileSize") if "fileSize" in body else None,
            state=int_of(body, "state") if "state" in body else None,
            snapshot=int_of(body, "snapshot") if "snapshot" in body else None,
            mapped=body.get("mapped", False),
            verdict=body.get("verdict", False),
        )


@record(frozen=True, slots=True)
class Done:
    """DONE (sandbox to host): run ``run`` finished with ``exit_code``; ``exception`` names an uncaught one.

    ``fork``: a run that loaded a fork's ``state`` says what it carried (variables and modules,
    counted) and what not (``skipped``, a few "name (why)" strings).
    """

    KIND: ClassVar[Kind] = Kind.DONE
    run: int
    exit_code: int
    exception: str | None
    fork: Forked | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"run": self.run, "exitCode": self.exit_code, "exception": self.exception}
        if self.fork is not None:
            body["fork"] = {
                "variables": self.fork.variables,
                "modules": self.fork.modules,
                "skipped": list(self.fork.skipped),
            }
        return body

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Done:
        fork = body.get("fork")
        if fork is not None:
            if not isinstance(fork, dict):
                raise FrameError("DONE fork must be an object")
            fork = Forked(
                int_of(fork, "variables"), int_of(fork, "modules"), strings_of(fork.get("skipped"), "skipped")
            )
        return cls(int_of(body, "run"), code_of(body, "exitCode"), optional_str_of(body, "exception"), fork)


@record(frozen=True, slots=True)
class Forked:
    """What a fork's first run carried from its source: counts, and what it could not carry (why)."""

    variables: int
    modules: int
    skipped: tuple[str, ...]


@record(frozen=True, slots=True)
class Error:
    """ERROR (either way): a protocol error; the sender closes the channel after it."""

    KIND: ClassVar[Kind] = Kind.ERROR
    message: str

    def encode(self) -> dict[str, Any]:
        return {"message": self.message}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Error:
        return cls(str_of(body, "message"))


@record(frozen=True, slots=True)
class Display:
    """DISPLAY (sandbox to host): an image run ``run`` showed or saved; ``data`` is base64.

    The host still judges the image (its type, its bytes, the caps): the frame checks only types.
    """

    KIND: ClassVar[Kind] = Kind.DISPLAY
    run: int
    mime: str
    data: str

    def encode(self) -> dict[str, Any]:
        return {"run": self.run, "mime": self.mime, "data": self.data}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Display:
        return cls(int_of(body, "run"), str_of(body, "mime"), str_of(body, "data"))


@record(frozen=True, slots=True)
class Exited:
    """EXITED (zygote to host): run ``run``'s child ended with ``exit_code`` (128 + signal).

    ``problem`` says why the zygote could not restore the sandbox (it exits then).
    """

    KIND: ClassVar[Kind] = Kind.EXITED
    run: int
    exit_code: int
    problem: str | None

    def encode(self) -> dict[str, Any]:
        return {"run": self.run, "exitCode": self.exit_code, "problem": self.problem}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Exited:
        return cls(int_of(body, "run"), code_of(body, "exitCode"), optional_str_of(body, "problem"))


@record(frozen=True, slots=True)
class Verdict:
    """VERDICT (host to sandbox): whether the seal of run ``run``'s state held (``ok``), checked by the
    host while the runtime read the state (an EXEC with ``verdict``). Only ``ok`` lets it be loaded."""

    KIND: ClassVar[Kind] = Kind.VERDICT
    run: int
    ok: bool

    def encode(self) -> dict[str, Any]:
        return {"run": self.run, "ok": self.ok}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Verdict:
        ok = body.get("ok")
        if not isinstance(ok, bool):
            raise FrameError("VERDICT ok must be a boolean")
        return cls(int_of(body, "run"), ok)


Frame = Ready | Exec | Done | Call | Reply | Error | Display | Exited | Verdict

_CLASSES: dict[Kind, Any] = {
    frame.KIND: frame for frame in (Ready, Exec, Done, Call, Reply, Error, Display, Exited, Verdict)
}


def decode(kind: Kind, body: dict[str, Any]) -> Frame:
    """The typed frame of ``kind`` with ``body``.

    Raises:
        FrameError: a field is missing or of the wrong type.
    """
    frame: Frame = _CLASSES[kind].decode(body)
    return frame


def pack(frame: Frame) -> bytes:
    """Serialise one typed frame."""
    return encode(frame.KIND, frame.encode())
