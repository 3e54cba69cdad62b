#!/bin/bash
# Install into a venv with uv: how the Makefile fills its venvs (.venv, .runtime/python, .downstream/*).
#
#   scripts/uv-pip.sh UV VENV_PYTHON install|check [ARG...]
#
# uv installs the same packages as pip, from the same index, many times as fast (pip spends its
# time evaluating index links and writing its files one by one; CONTRIBUTING.md has the figures).
# uv reads no pip.conf, so what pip is configured to fetch with is handed on: its index
# (PIP_INDEX_URL or global.index-url: a mirror, say; without one, both use PyPI) and its CA bundle
# (PIP_CERT or global.cert, as SSL_CERT_FILE unless that is set: a client that starts `make run`
# with a bare environment still gets through a TLS-inspecting proxy that pip's bundle trusts).
# Bytecode is compiled at install, as pip does, so that the first processes to import a package
# do not each compile it.
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 UV VENV_PYTHON install|check [ARG...]" >&2; exit 2; }
uv=$1 python=$2 command=$3
shift 3

if [ "$command" = install ]; then
    # pip's configuration, read by the pip beside uv (the venvs uv fills need none).
    config=$("$(dirname "$uv")/python" -m pip config list 2>/dev/null || true)
    setting() { sed -n "s/^global\.$1='\(.*\)'\$/\1/p" <<<"$config" | tail -n 1; }
    index=${PIP_INDEX_URL:-$(setting index-url)}
    cert=${PIP_CERT:-$(setting cert)}
    [ -z "$index" ] || export UV_DEFAULT_INDEX="$index"
    [ -z "$cert" ] || [ -n "${SSL_CERT_FILE:-}" ] || export SSL_CERT_FILE="$cert"
fi

case "$command" in
    install) exec "$uv" pip install --quiet --compile-bytecode --python "$python" "$@" ;;
    check) exec "$uv" pip check --python "$python" "$@" ;;
    *) echo "$0: unknown command $command (install or check)" >&2; exit 2 ;;
esac
