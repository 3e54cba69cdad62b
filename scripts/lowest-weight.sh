#!/bin/bash
# Run a command at the lowest CPU weight, so that whatever else runs keeps the CPU it asks for.
# `make test` runs its background lane (tests/conftest.py) this way, beside the serial tests.
#
#   scripts/lowest-weight.sh --check     exit 0 where this host allows it, else 1 saying why
#   scripts/lowest-weight.sh CMD [ARG..] run CMD so, and exit with its status
#
# As root on cgroup v1 (cpu.shares), CMD runs in a cpu cgroup of its own whose weight is the
# lowest (2, against 1024 for everything else). Each sandbox has cgroups of its own, made below
# the cgroup of the server or test that starts them (src/mcp_sandbox/sandbox/cgroups/run.py), so
# CMD's sandboxes share CMD's weight. CMD is not niced: within the cgroup, a niced test would
# weigh far less than its own sandboxes and fall behind what it watches (a disk watch let a
# writer far past its quota so, in CI). nice alone would not do either: the sandboxes' cgroups
# compete with their weight, not their processes' nice. podman's and docker's containers do not
# share CMD's weight (their cgroups are their engines'), which is why the background lane holds
# no container test. Elsewhere (cgroup v2, or not root) --check fails and `make test` runs the
# lane after the serial tests instead.
set -euo pipefail

controller=/sys/fs/cgroup/cpu
why_not() {
    if [ "$(id -u)" != 0 ]; then
        echo "not root"
    elif [ ! -w "$controller/cpu.shares" ] || [ ! -w "$controller/cgroup.procs" ]; then
        echo "no writable cgroup v1 cpu controller at $controller"
    fi
}

if [ "${1-}" = --check ]; then
    reason=$(why_not)
    [ -z "$reason" ] || { echo "lowest-weight: $reason: the background tests run after the serial ones" >&2; exit 1; }
    exit 0
fi
[ $# -gt 0 ] || { echo "usage: $0 --check | CMD [ARG...]" >&2; exit 2; }
reason=$(why_not)
[ -z "$reason" ] || { echo "lowest-weight: $reason" >&2; exit 1; }

group="$controller/mcp-tests-lowest-weight-$$"
mkdir "$group"
echo 2 >"$group/cpu.shares"
status=0
(echo "$BASHPID" >"$group/cgroup.procs" && exec "$@") || status=$?
# What CMD left running is a leak of its own: named, then killed, so the cgroup can go.
left=$(cat "$group/cgroup.procs")
if [ -n "$left" ]; then
    echo "lowest-weight: CMD left these running, now killed:" >&2
    ps -o pid=,args= -p "$(echo $left | tr ' ' ,)" >&2 || true
    kill -KILL $left 2>/dev/null || true
fi
for _ in 1 2 3 4 5 6 7 8 9 10; do
    rmdir "$group" 2>/dev/null && break
    sleep 0.5
done
[ ! -d "$group" ] || echo "lowest-weight: $group could not be removed" >&2
exit "$status"
