#!/usr/bin/env bash
# Install the Debian packages mcp-sandbox needs, but only those that are missing.
#
#   scripts/install-system-deps.sh [EXTRA_PACKAGE...]
#
# With everything already installed this only asks dpkg and exits: no apt-get, no sudo.
# Otherwise it runs `apt-get update && apt-get install -y` for the missing packages, as root
# directly or through sudo; with neither it names the packages and fails.
set -euo pipefail

packages=(
    bubblewrap       # bwrap, the sandbox itself
    util-linux       # setpriv: a root server's sandboxes drop to the sandbox uid (essential on Debian)
    gcc              # compiles the sandbox's gate (src/mcp_sandbox/sandbox/gate.c) at setup
    libc6-dev        # ... statically: the C library's static archive
    libseccomp2      # loaded by pyseccomp to build the syscall filter
    python3-venv     # venv/ensurepip for Debian's /usr/bin/python3 (the sandbox's interpreter)
    ca-certificates  # TLS to the package index
    git              # mcp-server-git, a downstream server in the tests (make downstream)
    iproute2         # ip netns / veth: the egress tests' own test hosts (tests/egress)
    openssl          # the egress tests' own CA and HTTPS certificate
    curl             # the earlier code runner's README calls, replayed literally in the tests
    xfsprogs         # mkfs.xfs: a root server's reflink volume for forks (workspaces.volume_bytes)
)
packages+=("$@")

is_installed() {
    # `dpkg -s` also succeeds for a removed package whose config files remain; ask for the state.
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-system-deps: dpkg-query not found; this script supports Debian (12) and derivatives." >&2
    echo "install-system-deps: install these packages by hand: ${packages[*]}" >&2
    exit 1
fi

missing=()
for pkg in "${packages[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

echo "install-system-deps: installing missing Debian packages: ${missing[*]}" >&2

if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "" >&2
    echo "install-system-deps: ERROR: these Debian packages are missing: ${missing[*]}" >&2
    echo "install-system-deps: you are not root and sudo is not installed; as root, run:" >&2
    echo "    apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
fi

"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"

still_missing=()
for pkg in "${missing[@]}"; do
    is_installed "$pkg" || still_missing+=("$pkg")
done
if [ ${#still_missing[@]} -ne 0 ]; then
    echo "install-system-deps: ERROR: still not installed after apt-get: ${still_missing[*]}" >&2
    exit 1
fi
