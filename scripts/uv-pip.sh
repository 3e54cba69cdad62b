#!/bin/bash
# Install into a venv with uv: how the Makefile fills its venvs (.venv, .runtime/python, .downstream/*).
#
#   scripts/uv-pip.sh UV VENV_PYTHON install|check [ARG...]
#
# uv installs the same packages as pip, from the same index, many times as fast (pip spends its
# time evaluating index links and writing its files one by one; CONTRIBUTING.md has the figures).
# uv reads no pip.conf, so the index pip is configured with (PIP_INDEX_URL or pip's
# global.index-url: a mirror, say) is handed on; without one, both use PyPI. Bytecode is compiled
# at install, as pip does, so that the first processes to import a package do not each compile it.
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 UV VENV_PYTHON install|check [ARG...]" >&2; exit 2; }
uv=$1 python=$2 command=$3
shift 3

# pip is the one beside uv (the venvs uv fills need none).
index=${PIP_INDEX_URL:-$("$(dirname "$uv")/python" -m pip config get global.index-url 2>/dev/null || true)}
[ -z "$index" ] || export UV_DEFAULT_INDEX="$index"

case "$command" in
    install) exec "$uv" pip install --quiet --compile-bytecode --python "$python" "$@" ;;
    check) exec "$uv" pip check --python "$python" "$@" ;;
    *) echo "$0: unknown command $command (install or check)" >&2; exit 2 ;;
esac
