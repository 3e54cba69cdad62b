"""The state directory's reflink volume: a sparse XFS image, loop-mounted at ``<state_dir>/volume``.

A fork copies its source's files (:mod:`mcp_sandbox.workspace.cloning`): on a filesystem with
reflinks (XFS, btrfs) each file is one ``FICLONE`` that shares the source's blocks until either
side writes, so a fork costs the same for 1 MB and 1 GB and writes only its own changes; on
ext4, the filesystem Debian installs, the copy reads and writes every byte. A server running as
root there is given a filesystem with reflinks of its own: ``workspaces.volume_bytes`` sizes a
sparse image file (``volume.xfs``, taking only what its files hold) that is formatted as XFS
with reflinks once and mounted on a loop device with direct I/O (its pages are not cached twice)
and ``discard`` (a file deleted inside gives its blocks back to the host's filesystem). Only the
three directories that must share one filesystem move there: ``workspaces/``, ``runs/`` (whose
slots are renamed over conversations' directories) and ``uploads/`` (renamed into them).

Why not overlay layers (see docs/design.md): a live source's sandbox keeps its ``/workspace``
bound to the directory it started on, with open files and working directories in it, so the
source's files cannot become a frozen lower layer without stopping that sandbox; reflinks freeze
nothing and leave every workspace an ordinary directory for the code that walks, serves,
uploads, adopts and deletes them.

The commands are the system's own (``mkfs.xfs`` from xfsprogs, ``losetup``, ``mount``): no
library does this from Python.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from mcp_sandbox.errors import ConfigError

__all__ = ["IMAGE_FILE", "VOLUME_DIR", "can_reflink", "ensure_volume", "release_volume"]

IMAGE_FILE = "volume.xfs"
LOCK_FILE = "volume.lock"
VOLUME_DIR = "volume"
FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
_COMMAND_SECONDS = 60.0
# What the volume's directories must not already hold outside it: they would be hidden under it.
_MOVED = ("workspaces", "runs", "uploads")


def can_reflink(directory: Path) -> bool:
    """Whether files in ``directory`` can share blocks (``FICLONE`` between two scratch files)."""
    try:
        with tempfile.TemporaryFile(dir=directory) as source, tempfile.TemporaryFile(dir=directory) as target:
            source.write(b"x" * 4096)
            source.flush()
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
            return True
    except OSError:
        return False


def _run(*argv: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"workspaces.volume_bytes: `{argv[0]}` failed: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(f"workspaces.volume_bytes: `{' '.join(argv)}` failed: {done.stderr.strip()}")


def _refuse_hidden(root: Path) -> None:
    """Refuse a volume that would hide directories the state directory already has outside it."""
    for name in _MOVED:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(root / name) as entries:
            if any(entries):
                raise ConfigError(
                    f"workspaces.volume_bytes: {root / name} holds entries made without the volume, which it "
                    "would leave behind; use a new state directory, or unset workspaces.volume_bytes"
                )


def ensure_volume(root: Path, size: int) -> Path:
    """Mount ``root``'s volume (made on first use) at ``root/volume`` unless it is; return it.

    One process at a time mounts it (``volume.lock``): a server and a ``run`` starting together
    on one state directory would otherwise both try. A ``size`` larger than the image's grows it
    (the image, then its filesystem once mounted); a smaller one is not a shrink (XFS cannot) and
    leaves it as it is.

    Raises:
        ConfigError: the server is not root, ``mkfs.xfs`` is missing, ``root`` already holds
            workspaces, runs or uploads outside a volume, or a command failed (named).
    """
    mount = root / VOLUME_DIR
    if os.path.ismount(mount):
        return mount
    if os.geteuid() != 0:
        raise ConfigError("workspaces.volume_bytes: mounting the volume needs the server to run as root")
    try:
        lock = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(f"workspaces.volume_bytes: cannot open {root / LOCK_FILE}: {exc.strerror}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.ismount(mount):  # another process may have mounted it meanwhile
            _mount(root, size)
    finally:
        os.close(lock)
    return mount


def _mount(root: Path, size: int) -> None:
    mount, image = root / VOLUME_DIR, root / IMAGE_FILE
    try:
        mount.mkdir(mode=0o700, exist_ok=True)
        fresh = not image.exists()
        if fresh:
            _refuse_hidden(root)
            if shutil.which("mkfs.xfs") is None:
                raise ConfigError("workspaces.volume_bytes: mkfs.xfs is not installed (Debian: xfsprogs)")
            descriptor = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(descriptor, size)
            finally:
                os.close(descriptor)
        grow = not fresh and image.stat().st_size < size
        if grow:
            os.truncate(image, size)
    except OSError as exc:
        raise ConfigError(f"workspaces.volume_bytes: cannot make {image}: {exc.strerror}") from exc
    try:
        if fresh:
            _run("mkfs.xfs", "-q", "-m", "reflink=1", str(image))
        # `-o loop` sets the device to clear itself when unmounted.
        _run("mount", "-t", "xfs", "-o", "loop,discard,nodev,nosuid", str(image), str(mount))
    except ConfigError:
        if fresh:
            image.unlink(missing_ok=True)
        raise
    device = _source_of(mount)
    if device is not None and device.startswith("/dev/loop"):
        # Direct I/O: the image's pages are not cached a second time under the volume's own.
        with contextlib.suppress(ConfigError):  # a host filesystem without it: cached twice, still correct
            _run("losetup", "--direct-io=on", device)
    if grow:
        if device is not None and device.startswith("/dev/loop"):
            # mount may reuse a loop device still attached to the image at its old size
            _run("losetup", "--set-capacity", device)
        _run("xfs_growfs", "-d", str(mount))
    os.chmod(mount, 0o700)  # XFS makes its top 0755: closed until the layout opens it to traversal


def release_volume(root: Path) -> None:
    """Unmount ``root``'s volume, which frees its loop device (the image and its files stay).

    Raises:
        ConfigError: it is busy (a sandbox still runs in it) or a command failed.
    """
    mount = root / VOLUME_DIR
    if os.path.ismount(mount):
        _run("umount", str(mount))


def _source_of(mount: Path) -> str | None:
    """The device mounted at ``mount`` (from this process's mount table)."""
    target = str(mount)
    with open("/proc/self/mounts", encoding="utf-8") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 1 and fields[1].encode().decode("unicode_escape") == target:
                return fields[0]
    return None
