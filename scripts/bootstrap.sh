#!/usr/bin/env bash
# First step on a fresh Debian 12 machine, where even `make` may be missing:
#
#   scripts/bootstrap.sh [MAKE_TARGET...]     (default target: setup)
#
# Installs the system packages (plus make) if missing, then runs make with the given targets.
set -euo pipefail
cd "$(dirname "$0")/.."

extra=()
command -v make >/dev/null 2>&1 || extra+=(make)
bash scripts/install-system-deps.sh "${extra[@]}"

if [ $# -eq 0 ]; then
    set -- setup
fi
exec make "$@"
