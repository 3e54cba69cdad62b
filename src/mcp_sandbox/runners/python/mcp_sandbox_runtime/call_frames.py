"""The frames of a run's calls through the host (code mode): CALL, and REPLY with its
:class:`Failure` (stdlib only; :mod:`.frames` joins them to the other kinds)."""

from __future__ import annotations

from typing import Any, ClassVar

from .fields import int_of, optional_str_of, str_of
from .records import record
from .wire import FrameError, Kind

__all__ = ["Call", "Failure", "Reply"]


@record(frozen=True, slots=True)
class Call:
    """CALL (sandbox to host): request ``id``; ``request`` is its JSON object, with its ``op``.

    The frame checks only the id: the request is the mediator's to decode (a malformed request is
    answered with an ``invalid`` REPLY, not a broken channel).
    """

    KIND: ClassVar[Kind] = Kind.CALL
    id: int
    request: dict[str, Any]

    def encode(self) -> dict[str, Any]:
        return {**self.request, "id": self.id}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Call:
        call_id = body.get("id")
        if not isinstance(call_id, int) or isinstance(call_id, bool):
            raise FrameError("a CALL frame needs an integer id")
        return cls(call_id, {key: value for key, value in body.items() if key != "id"})


@record(frozen=True, slots=True)
class Failure:
    """Why a request failed (a REPLY's ``error``).

    ``kind``: ``tool`` (the tool reported an error), ``denied`` (the run may not make the call),
    ``unavailable`` (the server is down or did not answer), ``invalid`` (a malformed request).
    """

    kind: str
    message: str
    server: str | None = None

    def encode(self) -> dict[str, Any]:
        body = {"kind": self.kind, "message": self.message}
        if self.server is not None:
            body["server"] = self.server
        return body

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Failure:
        return cls(str_of(body, "kind"), str_of(body, "message"), optional_str_of(body, "server"))


@record(frozen=True, slots=True)
class Reply:
    """REPLY (host to sandbox): the answer to CALL ``id``: its ``result``, or its ``error``."""

    KIND: ClassVar[Kind] = Kind.REPLY
    id: int
    result: Any = None
    error: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def encode(self) -> dict[str, Any]:
        if self.error is None:
            return {"ok": True, "result": self.result, "id": self.id}
        return {"ok": False, "error": self.error.encode(), "id": self.id}

    @classmethod
    def decode(cls, body: dict[str, Any]) -> Reply:
        call_id, ok, error = int_of(body, "id"), body.get("ok"), body.get("error")
        if not isinstance(ok, bool):
            raise FrameError("'ok' must be a boolean")
        if ok:
            return cls(call_id, body.get("result"))
        if not isinstance(error, dict):
            raise FrameError("a failed REPLY needs an error object")
        return cls(call_id, error=Failure.decode(error))
