"""Assemble a container root filesystem from this Debian host's own packages, offline.

    python3 scripts/container_rootfs.py ROOTFS [EXTRA_PACKAGE...]

Copies the files of Debian's python3 and of a few basics (a shell, coreutils, su and polkit's
helper, which the conformance suite attacks), with every package they depend on, into ROOTFS,
adds the usr-merge links, a passwd/group with nobody, the CA bundle and a linker cache. The
sandbox's Python environment (.runtime/python, numpy, pandas...) is not copied: the container
backends bind it from the host at its own path, like bwrap does, and it runs on this python3.
No registry is needed: scripts/build-container-image.sh imports the result as an image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BASE_PACKAGES = ("python3", "dash", "coreutils", "util-linux", "libstdc++6", "libgcc-s1", "tzdata", "polkitd")
USR_MERGED = ("bin", "sbin", "lib", "lib64")
# Mount points the container runtime needs in a read-only root, plus the workspace's.
DIRECTORIES = ("dev", "proc", "sys", "run", "tmp", "var/tmp", "etc", "workspace", "data", "opt", "tools")


def installed(package: str) -> bool:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Status}", package], capture_output=True, text=True, check=False
    )
    return done.stdout == "installed"


def depends(package: str) -> list[str]:
    """The installed packages ``package`` depends on (first installed alternative of each)."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", package], capture_output=True, text=True, check=True
    )
    found: list[str] = []
    for clause in done.stdout.split(","):
        for alternative in clause.split("|"):
            name = re.sub(r"\(.*?\)|:any|:amd64", "", alternative).strip()
            if name and installed(name):
                found.append(name)
                break
    return found


def closure(roots: list[str]) -> list[str]:
    seen: set[str] = set()
    todo = [p for p in roots if installed(p)]
    while todo:
        package = todo.pop()
        if package in seen:
            continue
        seen.add(package)
        todo.extend(depends(package))
    return sorted(seen)


def copy_package(package: str, rootfs: Path) -> None:
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        source = Path(line)
        if not line.startswith("/") or (source.is_dir() and not source.is_symlink()):
            continue
        if not (source.exists() or source.is_symlink()):
            continue  # a conffile the admin removed, a diverted path
        target = rootfs / line.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            continue
        shutil.copy2(source, target, follow_symlinks=False)  # keeps setuid bits: the attacks need them


def compile_python(rootfs: Path) -> None:
    """Pre-compile the copied standard library (Debian compiles it when the package is installed,
    so the package's file list has no bytecode): the container's root is read-only, so without it
    every import in every container compiles its modules anew (tens of ms for a few modules).

    Compiled by this interpreter, the host's own python3 the copy was made from, for the paths
    they have inside the image.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    library = rootfs / "usr/lib" / version
    if not (rootfs / "usr/bin" / version).exists() or not library.is_dir():
        print(f"container_rootfs: no {version} copied; its library is not pre-compiled", file=sys.stderr)
        return
    # -qq: a few test files in the library are not valid Python on purpose.
    command = [sys.executable, "-m", "compileall", "-qq", "-j", "0", "-s", str(rootfs), "-p", "/", str(library)]
    subprocess.run(command, check=False)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 64
    rootfs = Path(argv[0])
    if rootfs.exists():
        shutil.rmtree(rootfs)
    rootfs.mkdir(parents=True)
    for name in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    for name in USR_MERGED:
        (rootfs / name).symlink_to(f"usr/{name}")
    for name in DIRECTORIES:
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    (rootfs / "var/tmp").chmod(0o1777)
    packages = closure([*BASE_PACKAGES, *argv[1:]])
    for package in packages:
        copy_package(package, rootfs)
    etc = rootfs / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for name in ("hostname", "resolv.conf"):
        (etc / name).touch()
    # Loopback names only (the backends run containers with --no-hosts): as the bwrap sandbox's.
    shutil.copyfile(Path(__file__).parents[1] / "src/mcp_sandbox/sandbox/etc/hosts", etc / "hosts")
    certificates = Path("/etc/ssl/certs/ca-certificates.crt")
    if certificates.exists():
        (etc / "ssl/certs").mkdir(parents=True, exist_ok=True)
        shutil.copy2(certificates, etc / "ssl/certs/ca-certificates.crt")
    compile_python(rootfs)
    subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)
    os.chmod(rootfs, 0o755)
    print(f"container_rootfs: {len(packages)} packages into {rootfs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
