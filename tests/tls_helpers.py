"""A test's own certificate authority (the openssl CLI): a CA and certificates it signed for 127.0.0.1.

Each certificate has no extended key usage, so it serves both ends of a mutual-TLS hop: a replica
listens with it and presents it when it calls another.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["certificates"]

_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def certificates(directory: Path, name: str, count: int = 1) -> tuple[Path, list[tuple[Path, Path]]]:
    """A CA named ``name`` in ``directory``, and ``count`` certificates it signed: CA, [(cert, key)]."""
    if shutil.which("openssl") is None:
        pytest.skip("the TLS tests need openssl")
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=directory)

    openssl("req", "-x509", *_CURVE, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", f"/CN={name}")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    issued: list[tuple[Path, Path]] = []
    for n in range(count):
        key, request, certificate = f"replica{n}.key", f"replica{n}.csr", f"replica{n}.pem"
        openssl("req", *_CURVE, "-keyout", key, "-out", request, "-subj", f"/CN=replica{n}")
        openssl(
            "x509", "-req", "-in", request, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", certificate, "-days", "2", "-extfile", "san.ext",
        )  # fmt: skip
        issued.append((directory / certificate, directory / key))
    return directory / "ca.pem", issued
