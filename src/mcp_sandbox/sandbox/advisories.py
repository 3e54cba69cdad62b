"""Published sandbox-escape advisories of the programs a sandbox rests on, and which versions they hit.

``mcp-sandbox doctor`` reports the versions of bwrap, podman, crun, runc and the kernel here
(:mod:`.host_versions`) and warns, by advisory id, for each one below that a version is in. The
table is small on purpose: escapes out of the sandbox (or privilege gains that lead to one), not
every CVE of the programs. Sources: the projects' advisories and release notes; the Debian
versions from the packages' changelogs (``/usr/share/doc/<package>/changelog.Debian.gz``).

A distribution's patched build may carry a fix under an older upstream version: Debian 12's runc
``1.1.5+ds1-1+deb12u1`` fixes CVE-2024-21626, fixed upstream in 1.1.12. Such builds are listed
per advisory (``patched``) and compared by the distribution's own version (:func:`debian_compare`);
a patched build the table does not list is reported as affected, so the warning says to check
the distribution's tracker. Debian 12's bubblewrap ``0.8.0-2+deb12u1`` is *not* such a fix: it
backports ``--bind-fd`` for a Flatpak advisory (CVE-2024-42472) and still lacks 0.12.0's fix of
GHSA-pxhw-h44j-8pfx. Kernels are matched by their upstream version (a Debian kernel's from
``uname -v``): stable branches are listed separately, and a vendor kernel may differ still.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ADVISORIES", "Advisory", "Version", "affecting", "debian_compare", "parse_version"]

# (major, minor, patch, 1 for a release or 0 for a pre-release, the pre-release's number)
Version = tuple[int, int, int, int, int]

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[-~.]?(?:rc)\.?(\d+))?")


def parse_version(text: str) -> Version | None:
    """The first version in ``text`` (``bubblewrap 0.8.0``, ``runc version 1.4.0-rc.3``,
    ``1.1.5+ds1-1+deb12u1``, ``1.0.0-rc93``); None when there is none."""
    found = _VERSION_RE.search(text)
    if found is None:
        return None
    major, minor, patch, rc = found.groups()
    return (int(major), int(minor), int(patch or 0), 0 if rc else 1, int(rc or 0))


@dataclass(frozen=True, slots=True)
class Advisory:
    """``ids`` of one flaw in ``component``; versions in ``[introduced, fixed)`` of any range are hit.

    ``patched``: distribution builds (Debian package versions) that carry the fix under an older
    upstream version; a build of the same upstream version at or after one of them is not hit.
    """

    component: str
    ids: str
    what: str
    ranges: tuple[tuple[str, str], ...]
    patched: tuple[str, ...] = ()

    def hits(self, version: Version, package: str | None = None) -> bool:
        """Whether ``version`` (with ``package``, its Debian package version, if known) is affected."""
        if package is not None:
            for fixed in self.patched:
                same_upstream = _upstream(fixed) == _upstream(package)
                if same_upstream and debian_compare(package, fixed) >= 0:
                    return False
        for introduced, fixed in self.ranges:
            low, high = parse_version(introduced), parse_version(fixed)
            if low is not None and high is not None and low <= version < high:
                return True
        return False

    @property
    def fixed_in(self) -> str:
        """The releases that fixed it, for the warning."""
        return " / ".join(fixed for _, fixed in self.ranges)


ADVISORIES: tuple[Advisory, ...] = (
    Advisory(
        "bwrap",
        "GHSA-pxhw-h44j-8pfx",
        "mount destinations under a path the sandbox can write follow its symlinks"
        " (mcp-sandbox mounts nothing there, and a test keeps it so)",
        (("0.0.0", "0.12.0"),),
    ),
    Advisory(
        "bwrap",
        "CVE-2017-5226",
        "the sandbox injects input into the calling terminal (TIOCSTI) without --new-session",
        (("0.0.0", "0.1.7"),),
    ),
    Advisory(
        "bwrap",
        "CVE-2020-5291",
        "setuid bwrap with --userns2 gives a user root on the host",
        (("0.4.0", "0.4.1"),),
    ),
    Advisory(
        "runc",
        "CVE-2019-5736",
        "a container overwrites the host's runc binary through /proc/self/exe",
        (("0.0.0", "1.0.0-rc7"),),
    ),
    Advisory(
        "runc",
        "CVE-2024-21626 (Leaky Vessels)",
        "a leaked host directory descriptor as the working directory escapes the container",
        (("1.0.0-rc93", "1.1.12"),),
        patched=("1.1.5+ds1-1+deb12u1",),
    ),
    Advisory(
        "runc",
        "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881",
        "masked paths, /dev/console and procfs writes redirected to host files (container escape)",
        (("0.0.0", "1.2.8"), ("1.3.0", "1.3.3"), ("1.4.0-rc.1", "1.4.0-rc.3")),
    ),
    Advisory(
        "kernel",
        "CVE-2022-0847 (Dirty Pipe)",
        "any user overwrites read-only files (the host's binaries from a sandbox)",
        (("5.8", "5.10.102"), ("5.11", "5.15.25"), ("5.16", "5.16.11")),
    ),
    Advisory(
        "kernel",
        "CVE-2022-0185",
        "a heap overflow in fs_context reachable from an unprivileged user namespace",
        (("5.1", "5.4.173"), ("5.5", "5.10.93"), ("5.11", "5.15.16"), ("5.16", "5.16.2")),
    ),
    Advisory(
        "kernel",
        "CVE-2024-1086",
        "a use-after-free in nf_tables reachable from an unprivileged user namespace",
        (
            ("3.15", "5.4.269"),
            ("5.5", "5.10.209"),
            ("5.11", "5.15.149"),
            ("5.16", "6.1.76"),
            ("6.2", "6.6.15"),
            ("6.7", "6.7.3"),
        ),
    ),
)


def affecting(component: str, version: Version, package: str | None = None) -> list[Advisory]:
    """The advisories of ``component`` that hit ``version`` (``package``: its Debian package version)."""
    return [item for item in ADVISORIES if item.component == component and item.hits(version, package)]


def _upstream(package: str) -> str:
    """A Debian version's upstream part: no epoch, no revision."""
    upstream = package.split(":", 1)[1] if ":" in package else package
    return upstream.rsplit("-", 1)[0] if "-" in upstream else upstream


def _order(char: str) -> int:
    # dpkg: "~" sorts before everything, even the end; letters before other characters.
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or revision: non-digits, then digits, in turn."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            x = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            y = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if x != y:
                return -1 if x < y else 1
            i, j = i + 1, j + 1
        start_i, start_j = i, j
        while i < len(a) and a[i].isdigit():
            i += 1
        while j < len(b) and b[j].isdigit():
            j += 1
        x, y = int(a[start_i:i] or 0), int(b[start_j:j] or 0)
        if x != y:
            return -1 if x < y else 1
    return 0


def debian_compare(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian package version ``a`` sorts before, with or after ``b`` (dpkg's order)."""

    def split(version: str) -> tuple[int, str, str]:
        epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), upstream, revision

    (ea, ua, ra), (eb, ub, rb) = split(a), split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)
