#!/usr/bin/env bash
# Create the dedicated, unprivileged system user the sandboxes run as when the server is root.
#
# mcp-sandbox drops to this user's uid/gid before it starts bwrap, so files a sandbox writes are
# not root's and a sandbox can never read the server's own files. Without the user, the server
# falls back to 65534 (nobody), which other daemons may share. Idempotent; does nothing when
# not root (a non-root server runs its sandboxes under its own uid).
set -euo pipefail
name=${1:-mcp-sandbox}

[ "$(id -u)" -eq 0 ] || exit 0
getent passwd "$name" >/dev/null && exit 0
useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "mcp-sandbox sandboxes" "$name"
echo "create-sandbox-user: created system user $name (uid $(id -u "$name"))" >&2
