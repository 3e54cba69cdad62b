#!/usr/bin/env bash
# Make what the sandbox mounts readable by its unprivileged uid, and warn when the path to
# the repository is closed to that uid (e.g. a clone under /root, which is 0700).
#
#   scripts/check-sandbox-access.sh [REPO_DIR]
#
# The sandbox binds src/mcp_sandbox/runners/python and .runtime/python read-only and runs
# as uid 65534 (SANDBOX_UID), so those files must be world-readable and every directory
# above them searchable (o+x). This script fixes the first; the second it only reports.
# It also pre-compiles the Python runner with the sandbox's interpreter: the sandbox cannot
# write __pycache__, so without it every sandbox compiles the runner anew (about 20 ms of CPU
# per start). A runner edited since is compiled in memory again until the next `make setup`.
# It never fails: the server still works for backends that do not need it.
set -uo pipefail

repo=$(cd "${1:-.}" && pwd -P)
sandbox_uid=${SANDBOX_UID:-65534}

runtime_python=$repo/.runtime/python/bin/python3
if [ -x "$runtime_python" ]; then
    "$runtime_python" -m compileall -q "$repo/src/mcp_sandbox/runners/python" >/dev/null ||
        echo "check-sandbox-access: could not pre-compile the Python runner (sandboxes compile it per start)" >&2
fi
chmod -R a+rX "$repo/src"
[ -d "$repo/.runtime" ] && chmod -R a+rX "$repo/.runtime"

closed=()
dir=$repo
while :; do
    mode=$(stat -c %a "$dir")
    if (( (8#$mode & 1) == 0 )); then
        closed+=("$dir ($(stat -c '%A %U' "$dir"))")
    fi
    [ "$dir" = / ] && break
    dir=$(dirname "$dir")
done

if [ ${#closed[@]} -ne 0 ]; then
    {
        echo
        echo "################################################################################"
        echo "WARNING: the sandbox's uid ($sandbox_uid) cannot reach this repository."
        echo "These directories lack the 'others may enter' bit (o+x):"
        printf '    %s\n' "${closed[@]}"
        echo "The sandbox runs untrusted code as uid $sandbox_uid and needs to read"
        echo "    $repo/src/mcp_sandbox/runners/python"
        echo "    $repo/.runtime/python"
        echo "so sandboxed runs will fail. Either clone the repository somewhere that is"
        echo "world-searchable (e.g. /srv or /opt) or grant search on those directories,"
        echo "e.g.: chmod o+x <dir>   (o+x lets others enter, not list, the directory)"
        echo "################################################################################"
        echo
    } >&2
fi
exit 0
