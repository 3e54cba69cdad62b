"""The fault-injection workload's clients and its model of what the cluster acknowledged.

Clients use only the public interface, through the balancer: ``run_python`` writing a file and a
variable, the ``upload_file`` tool, ``POST /upload``, a run reading a variable back, signed links.
Every path is written once, so a read-back has one right answer. A write is *acknowledged* when
the client got a success: a run without error whose answer does not say ``Files not saved``, an
upload tool result without error, a ``201``. The :class:`Model` records each acknowledged file
(conversation, path, sha256) and each attempted one (an unacknowledged write may land, but only
with the content sent); :func:`check` reads every conversation back by hash, through the live
cluster and through a fresh server restoring from the object store alone, and counts what was
lost, corrupted or could not be restored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_test_helpers import CALL_BOUND, new_conversation, upload

__all__ = ["UNSAVED", "Conversation", "Model", "Phase", "check", "check_links", "mcp_client", "sha", "workload"]

UNSAVED = "Files not saved"
# Every file under /workspace and its sha256, as one JSON line.
HASHES = """
import hashlib, json, os
found = {}
for root, _dirs, names in os.walk('/workspace'):
    for name in names:
        path = os.path.join(root, name)
        with open(path, 'rb') as f:
            found[os.path.relpath(path, '/workspace')] = hashlib.sha256(f.read()).hexdigest()
print(json.dumps(found))
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Conversation:
    """One conversation's history as its client saw it."""

    id: str
    acked: dict[str, str] = field(default_factory=dict)  # path -> sha256 the cluster acknowledged
    sent: dict[str, str] = field(default_factory=dict)  # path -> sha256 of every write tried
    variables: dict[str, int] = field(default_factory=dict)  # set by acknowledged runs, since the last loss
    links: list[tuple[str, str, str]] = field(default_factory=list)  # (path, signed url, sha256)
    writes: int = 0


@dataclass
class Phase:
    """How a workload phase runs: during a fault (refusals allowed) or not, each call bounded."""

    faulty: bool
    bound: float = CALL_BOUND
    ops: int = 2  # operations per conversation


@dataclass
class Model:
    """Every conversation of one scenario, and what went wrong so far (each list names the cases)."""

    name: str
    conversations: list[Conversation]
    refused: list[str] = field(default_factory=list)  # writes refused while no fault was on
    held: list[str] = field(default_factory=list)  # calls that did not answer within their bound
    statuses: list[str] = field(default_factory=list)  # an upload refused as if it were the client's fault
    state: list[str] = field(default_factory=list)  # a variable gone without stateLost saying so
    lost: list[str] = field(default_factory=list)  # acknowledged files not read back
    corrupt: list[str] = field(default_factory=list)  # a file read back with content never sent
    unrestorable: list[str] = field(default_factory=list)  # conversations that could not be read back

    @classmethod
    def new(cls, name: str, clients: int, per_client: int) -> Model:
        return cls(name, [Conversation(new_conversation()) for _ in range(clients * per_client)])

    def report(self) -> str:
        acked = sum(len(c.acked) for c in self.conversations)
        sent = sum(len(c.sent) for c in self.conversations)
        counts = {
            "acknowledged": acked,
            "sent": sent,
            "lost": len(self.lost),
            "unrestorable": len(self.unrestorable),
            "corrupt": len(self.corrupt),
            "refused": len(self.refused),
            "held": len(self.held),
            "statuses": len(self.statuses),
            "state": len(self.state),
        }
        details = {k: v[:5] for k, v in vars(self).items() if isinstance(v, list) and v and k != "conversations"}
        return f"{self.name}: {counts} {details}"


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    """An SDK client of ``url``'s ``/mcp`` (the balancer's or one server's)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=CALL_BOUND) as web,
        Client(streamable_http_client(f"{url}/mcp", http_client=web), read_timeout_seconds=CALL_BOUND) as client,
    ):
        yield client


def _payload(conversation: Conversation, kind: str, size: int) -> tuple[str, bytes]:
    conversation.writes += 1
    # The conversation's id in the name: a file only its workspace has (Nemesis.owner finds it by it).
    return f"{kind}-{conversation.id[-8:]}-{conversation.writes}.bin", secrets.token_bytes(size)


class _Writer:
    """One workload client: its conversations' operations in turn, each bounded and recorded."""

    def __init__(self, model: Model, url: str, token: str, phase: Phase) -> None:
        self.model, self.url, self.token, self.phase = model, url, token, phase

    async def _tool(self, what: str, tool: str, arguments: dict[str, Any]) -> Any:
        """``tool``'s result through a client of its own (a cut connection spoils no other call), bounded."""

        async def call() -> Any:
            async with mcp_client(self.url, self.token) as client:
                return await client.call_tool(tool, arguments)

        return await self._bounded(what, call)

    async def _bounded(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()``'s answer, or None when it raised or did not answer within the phase's bound."""
        try:
            with anyio.fail_after(self.phase.bound):
                return await call()
        except TimeoutError:
            self.model.held.append(what)
        except Exception:  # a refused or cut call: the model records it as not acknowledged
            return None
        return None

    def _refused(self, conversation: Conversation, what: str) -> None:
        conversation.variables.clear()  # it may have run on an interpreter that is gone since
        if not self.phase.faulty:
            self.model.refused.append(f"{conversation.id} {what}")

    async def run_write(self, conversation: Conversation) -> None:
        path, data = _payload(conversation, "run", 2000 + conversation.writes * 517)
        variable = f"v{conversation.writes}"
        encoded = base64.b64encode(data).decode()
        code = f"import base64\nopen('/workspace/{path}', 'wb').write(base64.b64decode('{encoded}'))\n"
        code += f"{variable} = {conversation.writes}"
        conversation.sent[path] = sha(data)
        result = await self._tool(path, "run_python", {"code": code, "conversationId": conversation.id})
        data_ = getattr(result, "structured_content", None) or {}
        if result is None or result.is_error or UNSAVED in str(data_.get("warning", "")):
            # A run that failed may have written part of its file itself (a full disk): any content goes.
            del conversation.sent[path]
            self._refused(conversation, f"{path}: {data_.get('warning') or getattr(result, 'content', 'no answer')}")
            return
        if data_.get("stateLost"):
            conversation.variables.clear()
        conversation.variables[variable] = conversation.writes
        conversation.acked[path] = sha(data)
        conversation.links += [(path, f["url"], sha(data)) for f in data_.get("files", []) if f["name"] == path]

    async def tool_upload(self, conversation: Conversation) -> None:
        path, data = _payload(conversation, "tool", 3000)
        conversation.sent[path] = sha(data)
        arguments = {"conversationId": conversation.id, "filename": path, "content": base64.b64encode(data).decode()}
        result = await self._tool(path, "upload_file", arguments)
        if result is None or result.is_error:
            self._refused(conversation, f"{path}: {getattr(result, 'content', 'no answer')}")
            return
        conversation.acked[path] = sha(data)

    async def http_upload(self, conversation: Conversation, path: str = "", data: bytes = b"") -> None:
        if not path:
            path, data = _payload(conversation, "post", 5000)
        conversation.sent[path] = sha(data)
        reply = await self._bounded(path, lambda: upload(self.url, self.token, conversation.id, path, data))
        status = getattr(reply, "status_code", None)
        if status == 201:
            conversation.acked[path] = sha(data)
            return
        # A refusal says "not now" (the server's 503, a full disk's 507, the balancer's 502 or 504
        # for a replica that died with the request), never the client's fault (a 4xx).
        if status is not None and status not in (502, 503, 504, 507):
            self.model.statuses.append(f"{path[:40]}: {status} {reply.text[:200]}")
        self._refused(conversation, f"{path[:40]}: {status}")

    async def read_variables(self, conversation: Conversation) -> None:
        expected = dict(conversation.variables)
        code = f"print({{k: globals().get(k) for k in {sorted(expected)!r}}})"
        result = await self._tool("read", "run_python", {"code": code, "conversationId": conversation.id})
        data = getattr(result, "structured_content", None) or {}
        if result is None or result.is_error:
            self._refused(conversation, f"read: {getattr(result, 'content', 'no answer')}")
            return
        if data.get("stateLost"):
            conversation.variables.clear()
            return
        if data.get("stdout") != f"{expected}\n":
            self.model.state.append(f"{conversation.id}: {expected} read as {data.get('stdout')!r} without stateLost")

    async def run(self, conversations: list[Conversation], start: int) -> None:
        operations = [self.run_write, self.tool_upload, self.http_upload, self.read_variables]
        for step in range(self.phase.ops):
            for conversation in conversations:
                await operations[(start + step) % len(operations)](conversation)


async def workload(model: Model, url: str, token: str, phase: Phase, clients: int) -> None:
    """``clients`` clients at once, each through its own connection to ``url``, over its share of
    the model's conversations."""
    share = len(model.conversations) // clients

    async def one(index: int) -> None:
        writer = _Writer(model, url, token, phase)
        await writer.run(model.conversations[index * share : (index + 1) * share], index)

    async with anyio.create_task_group() as group:
        for index in range(clients):
            group.start_soon(one, index)


async def read_back(url: str, token: str, conversation: Conversation) -> dict[str, str] | None:
    """Every file of ``conversation`` and its sha256, read by a run at ``url``; None if the run failed."""
    with anyio.fail_after(CALL_BOUND * 2):
        async with mcp_client(url, token) as client:
            result = await client.call_tool("run_python", {"code": HASHES, "conversationId": conversation.id})
    data = result.structured_content or {}
    if result.is_error or "stdout" not in data:
        return None
    found: dict[str, str] = json.loads(data["stdout"])
    return found


async def check(model: Model, url: str, token: str, where: str) -> None:
    """Read every conversation back at ``url`` (``where`` names it in the report): record what
    acknowledged files are missing or differ, what content was never sent, what cannot be read."""
    for conversation in model.conversations:
        try:
            found = await read_back(url, token, conversation)
        except Exception as exc:  # the model records it as unrestorable
            found, reason = None, repr(exc)
        else:
            reason = "the run failed"
        if found is None:
            model.unrestorable.append(f"{where} {conversation.id}: {reason}")
            continue
        for path, digest in conversation.acked.items():
            if found.get(path) != digest:
                model.lost.append(
                    f"{where} {conversation.id} {path[:40]}: {'missing' if path not in found else 'differs'}"
                )
        for path, digest in found.items():
            if path in conversation.sent and conversation.sent[path] != digest:
                model.corrupt.append(f"{where} {conversation.id} {path[:40]}")


async def check_links(model: Model) -> None:
    """Every signed link an acknowledged run gave serves its file's content."""
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        for conversation in model.conversations:
            for path, link, digest in conversation.links:
                try:
                    reply = await web.get(link)
                except httpx2.HTTPError as exc:
                    model.lost.append(f"link {conversation.id} {path}: {exc!r}")
                    continue
                if reply.status_code != 200 or sha(reply.content) != digest:
                    model.lost.append(f"link {conversation.id} {path}: {reply.status_code}")
