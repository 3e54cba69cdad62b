"""A tenant's library: the helper functions (saved tools) and memories its code keeps between runs.

Sandboxed code asks the host to save or delete (``save_tool(func)``, ``save_memory(key, value)``,
...); only the host writes here, so one run cannot corrupt another's library or reach another
tenant's. On disk, per tenant, ``<state_dir>/library/<HMAC(tenant)>/``: ``tools/<name>.json``
(``{"name", "language", "description", "source"}``) and ``memories/<key>.json`` (the value).
Runs read it, read-only, at ``/tools/_library`` (``tools/<name>.py`` or ``.js``, ``memories/``):
:meth:`Library.view` writes a snapshot at the run's start into ``views_root`` (0711: no listing),
named after the tenant's directory and a hash of the content, world-readable like the tool stubs. A library is
bounded by ``library_bytes`` (its files' sizes) and ``library_entries`` (tools and memories); a
write past either is refused and changes nothing. Writes are atomic (a file renamed into place).
With a :class:`LibrarySync` (replicas sharing an object store), each write and delete is pushed
to it, and :meth:`Library.refresh` pulls the other replicas' changes before a run reads.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mcp_sandbox.errors import QuotaExceededError, ValidationError
from mcp_sandbox.runners import LANGUAGES
from mcp_sandbox.workspace.files import disk_error

__all__ = ["Library", "LibrarySync", "SavedTool"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_MAX_DESCRIPTION = 1000


@dataclass(frozen=True, slots=True)
class SavedTool:
    """One saved helper function and its source."""

    name: str
    language: str
    description: str
    source: str

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "language": self.language, "description": self.description}

    def doc(self) -> str:
        """One line for search results: how to call it, and what it does."""
        first = self.description.strip().splitlines()[0] if self.description.strip() else ""
        call = f"saved.{self.name}(...)" if self.language == "python" else f"mcp.saved.{self.name}(...)"
        return f"{call} [saved {self.language} tool]" + (f": {first}" if first else "")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValidationError("name", f"{name!r} is not an identifier of at most 64 characters")
    return name


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValidationError("key", f"{key!r} must be 1-128 letters, digits or _.- characters, not starting with '.'")
    return key


class LibrarySync(Protocol):
    """Another copy of each tenant's library directory (the object store's)."""

    def push(self, directory: Path) -> object:
        """Copy the directory's changes out. Raises WorkspaceError."""
        ...

    def pull(self, directory: Path) -> object:
        """Make the directory equal to the copy. Raises WorkspaceError."""
        ...


class Library:
    """Every tenant's library under ``root``; a tenant's directory is named by an HMAC under ``key``."""

    def __init__(
        self,
        root: Path,
        key: bytes,
        max_bytes: int,
        max_entries: int,
        views_root: Path,
        sync: LibrarySync | None = None,
    ) -> None:
        self._sync = sync
        self._root = root
        self._views = views_root
        self._key = key
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._lock = threading.Lock()  # quota check and write as one step
        # Every run asks (see empty()): the HMAC and the path are made once per tenant.
        self._dir = functools.lru_cache(maxsize=1024)(self._directory)

    def _directory(self, tenant: str) -> Path:
        return self._root / hmac.new(self._key, tenant.encode("utf-8"), hashlib.sha256).hexdigest()

    def refresh(self, tenant: str) -> None:
        """Take in the other replicas' changes to the tenant's library (nothing without a sync).

        Raises:
            WorkspaceError: the other copy cannot be read.
        """
        if self._sync is not None:
            with self._lock:
                self._sync.pull(self._dir(tenant))

    def _files(self, tenant: str) -> list[Path]:
        base = self._dir(tenant)
        return [path for kind in ("tools", "memories") for path in sorted((base / kind).glob("*.json"))]

    def _write(self, tenant: str, path: Path, data: bytes) -> None:
        with self._lock:
            files = self._files(tenant)
            replaced = path.stat().st_size if path.exists() else 0
            used = sum(file.stat().st_size for file in files) - replaced
            if used + len(data) > self._max_bytes:
                message = (
                    f"the library is over its quota: {used} + {len(data)} bytes > {self._max_bytes} (library_bytes)"
                )
                raise QuotaExceededError("bytes", used, self._max_bytes, message)
            if not replaced and len(files) + 1 > self._max_entries:
                message = f"the library holds {len(files)} entries already (library_entries)"
                raise QuotaExceededError("files", len(files), self._max_entries, message)
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            except OSError as exc:  # its message holds the path: the tenant sees disk_error's
                raise disk_error(exc, "the library cannot be written") from exc
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.replace(scratch, path)
                if self._sync is not None:
                    self._sync.push(self._dir(tenant))
            except OSError as exc:
                Path(scratch).unlink(missing_ok=True)
                raise disk_error(exc, "the library cannot be written") from exc
            except BaseException:
                Path(scratch).unlink(missing_ok=True)
                raise

    def save_tool(self, tenant: str, name: str, source: str, language: str, description: str = "") -> SavedTool:
        """Save (or replace) the tool ``name``.

        Raises:
            ValidationError: a bad name, language, source or description.
            QuotaExceededError: the library would pass its quota.
            WorkspaceError: it cannot be written (DiskFullError: the disk is full).
        """
        _check_name(name)
        if language not in LANGUAGES:
            raise ValidationError("language", f"{language!r} is not one of {', '.join(LANGUAGES)}")
        if not isinstance(source, str) or not source.strip():
            raise ValidationError("source", "must be the function's source code")
        if not isinstance(description, str) or len(description) > _MAX_DESCRIPTION:
            raise ValidationError("description", f"must be a string of at most {_MAX_DESCRIPTION} characters")
        tool = SavedTool(name, language, description, source)
        data = json.dumps({**tool.summary(), "source": source}, ensure_ascii=False).encode()
        self._write(tenant, self._dir(tenant) / "tools" / f"{name}.json", data)
        return tool

    def tool(self, tenant: str, name: str) -> SavedTool | None:
        """The saved tool ``name``, or None."""
        try:
            data = json.loads((self._dir(tenant) / "tools" / f"{_check_name(name)}.json").read_bytes())
        except FileNotFoundError:
            return None
        return SavedTool(data["name"], data["language"], data["description"], data["source"])

    def tools(self, tenant: str) -> list[SavedTool]:
        """Every saved tool, by name."""
        found = [self.tool(tenant, path.stem) for path in sorted((self._dir(tenant) / "tools").glob("*.json"))]
        return [tool for tool in found if tool is not None]

    def empty(self, tenant: str) -> bool:
        """Whether the tenant has neither tools nor memories (two directory scans, no reads; one
        ``stat`` for a tenant that never saved anything, the most common case)."""
        base = self._dir(tenant)
        if not base.is_dir():
            return True
        return not any(next((base / kind).glob("*.json"), None) for kind in ("tools", "memories"))

    def view(self, tenant: str) -> Path | None:
        """A read-only snapshot of the tenant's library for a run (None when it is empty).

        Snapshots are shared by runs of the same content; the tenant's older ones beyond the
        newest two are removed (a run still using one keeps what it opened).

        Raises:
            WorkspaceError: the snapshot cannot be written (DiskFullError: the disk is full).
        """
        try:
            return self._view(tenant)
        except OSError as exc:
            raise disk_error(exc, "the library cannot be read") from exc

    def _view(self, tenant: str) -> Path | None:
        files: dict[str, bytes] = {}
        for tool in self.tools(tenant):
            files[f"tools/{tool.name}.{'py' if tool.language == 'python' else 'js'}"] = tool.source.encode()
        for key in self.memories(tenant):
            files[f"memories/{key}.json"] = (self._dir(tenant) / "memories" / f"{key}.json").read_bytes()
        if not files:
            return None
        digest = hashlib.sha256()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        prefix = self._dir(tenant).name
        target = self._views / f"{prefix}-{digest.hexdigest()[:24]}"
        if not target.exists():
            self._views.mkdir(parents=True, exist_ok=True, mode=0o711)
            scratch = Path(tempfile.mkdtemp(dir=self._views, prefix=".tmp-"))
            for name, data in files.items():
                (scratch / name).parent.mkdir(parents=True, exist_ok=True)
                (scratch / name).write_bytes(data)
            for directory, _, names in os.walk(scratch):
                os.chmod(directory, 0o755)
                for name in names:
                    os.chmod(os.path.join(directory, name), 0o644)
            try:
                os.rename(scratch, target)
            except OSError:  # another run made the same snapshot first
                shutil.rmtree(scratch, ignore_errors=True)
        older = sorted(self._views.glob(f"{prefix}-*"), key=lambda path: path.stat().st_mtime, reverse=True)
        for stale in [path for path in older if path != target][1:]:
            shutil.rmtree(stale, ignore_errors=True)
        return target

    def search(self, tenant: str, query: str, limit: int) -> list[SavedTool]:
        """Saved tools whose name and description hold every word of ``query`` (any case)."""
        words = query.lower().replace("_", " ").split()
        found = []
        for tool in self.tools(tenant):
            text = f"{tool.name} {tool.name.replace('_', ' ')} {tool.description}".lower()
            if all(word in text for word in words):
                found.append(tool)
        return found[:limit]

    def save_memory(self, tenant: str, key: str, value: Any) -> None:
        """Save (or replace) the memory ``key``; ``value`` must be JSON.

        Raises:
            ValidationError: a bad key, or a value that is not JSON.
            QuotaExceededError: the library would pass its quota.
            WorkspaceError: it cannot be written (DiskFullError: the disk is full).
        """
        _check_key(key)
        try:
            data = json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValidationError(
                "value", f"must be JSON (dicts, lists, strings, numbers, booleans, None): {exc}"
            ) from exc
        self._write(tenant, self._dir(tenant) / "memories" / f"{key}.json", data)

    def load_memory(self, tenant: str, key: str) -> tuple[bool, Any]:
        """``(True, value)`` of the memory ``key``, or ``(False, None)`` when there is none."""
        try:
            return True, json.loads((self._dir(tenant) / "memories" / f"{_check_key(key)}.json").read_bytes())
        except FileNotFoundError:
            return False, None

    def memories(self, tenant: str) -> list[str]:
        """The keys of every memory, sorted."""
        return [path.stem for path in sorted((self._dir(tenant) / "memories").glob("*.json"))]

    def delete(self, tenant: str, kind: str, name: str) -> bool:
        """Delete a tool (``kind`` ``tools``) or memory (``memories``); whether it existed."""
        checked = _check_name(name) if kind == "tools" else _check_key(name)
        with self._lock:
            try:
                (self._dir(tenant) / kind / f"{checked}.json").unlink()
            except FileNotFoundError:
                return False
            if self._sync is not None:
                self._sync.push(self._dir(tenant))
        return True
