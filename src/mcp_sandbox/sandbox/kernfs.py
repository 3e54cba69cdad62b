"""The kernel's small files (cgroupfs, procfs), read and written with plain ``os`` calls.

Every sandbox reads and writes a dozen of them (its limits, its limit-hit counters, its process
tree, its members at the end), on the server's event loop. ``Path.read_text`` costs several
times the read itself there: a buffered file object, an ``fstat``, an ``isatty`` ``ioctl`` and
an ``lseek`` per file, and ``Path.is_dir`` a ``stat`` per entry where the directory listing
already says which entries are directories (bench/README.md has the figures).
"""

from __future__ import annotations

import errno
import os

__all__ = ["read", "subdirectories", "write"]

_CHUNK = 1 << 16


def read(path: str | os.PathLike[str]) -> str:
    """The file's whole text.

    Raises:
        OSError: it cannot be opened or read (``FileNotFoundError`` when it is gone).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, _CHUNK)]
        while chunks[-1]:  # a kernel file can come in more than one read: read to the end
            chunks.append(os.read(fd, _CHUNK))
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def write(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` in one ``write`` (a kernel file takes a value per write).

    Raises:
        OSError: the file cannot be opened, or the kernel refused the value.
    """
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"{path}: the kernel took part of {text!r}")
    finally:
        os.close(fd)


def subdirectories(path: str | os.PathLike[str]) -> list[str]:
    """The paths of the directories directly in ``path`` (from the listing's entry types).

    Raises:
        OSError: it cannot be listed.
    """
    with os.scandir(path) as entries:
        return [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
