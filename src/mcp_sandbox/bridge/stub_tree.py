"""Writing the stubs' files (:mod:`.stubs`) where the sandbox reads them: one directory per content.

A tree is named after the SHA-256 of its paths and texts, written aside and renamed into place,
so it appears whole or not at all, and a tree already there is reused: the servers of many runs
and concurrent writers of the same stubs share one copy. Its directories are 0755 and its files
0644, for the sandbox's unprivileged uid, which sees it read-only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["write_tree"]


def write_tree(root: Path, files: Mapping[str, str], *, prefix: str = "tools") -> Path:
    """Write ``files`` once into ``root/<prefix>-<sha256 of the files, 16 hex>`` and return that directory.

    The directory appears atomically (written aside, then renamed); when it already exists it is
    reused, so concurrent writers of the same files all succeed. Directories are 0755 and files
    0644: the sandbox's unprivileged uid reads them. ``root`` must exist.

    Raises:
        ValueError: ``prefix`` or a path in ``files`` would leave ``root``.
        OSError: the tree cannot be written.
    """
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", prefix):
        raise ValueError(f"bad tree prefix {prefix!r}")
    digest = hashlib.sha256()
    for path in sorted(files):
        parts = path.split("/")
        if not path or any(part in ("", ".", "..") for part in parts) or "\0" in path:
            raise ValueError(f"bad path in tree: {path!r}")
        for chunk in (path.encode(), files[path].encode()):
            digest.update(len(chunk).to_bytes(8, "big") + chunk)
    target = root / f"{prefix}-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    scratch = Path(tempfile.mkdtemp(prefix=f".{prefix}-", dir=root))
    try:
        scratch.chmod(0o755)
        for path, text in files.items():
            dest = scratch / path
            for parent in reversed(dest.relative_to(scratch).parents[:-1]):
                (scratch / parent).mkdir(mode=0o755, exist_ok=True)
                (scratch / parent).chmod(0o755)
            dest.write_text(text, encoding="utf-8")
            dest.chmod(0o644)
        try:
            os.rename(scratch, target)
        except OSError:
            if not target.is_dir():  # not lost to a concurrent writer of the same tree
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch)
    return target
