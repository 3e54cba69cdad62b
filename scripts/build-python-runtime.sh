#!/usr/bin/env bash
# Build the sandbox's Python environment: a venv of Debian's interpreter with the pinned
# packages untrusted code may import. It is separate from the server's .venv and is mounted
# read-only inside the sandbox, which runs as an unprivileged uid (65534), so:
#   - it uses /usr/bin/python3, not pyenv's (root's home, 0700, is unreadable to that uid);
#   - everything is pre-compiled to bytecode (the sandbox cannot write __pycache__);
#   - everything is world-readable.
#
#   scripts/build-python-runtime.sh [RUNTIME_DIR] [REQUIREMENTS]
#
# Defaults: .runtime/python and runtime/python-requirements.txt. Rebuilds from scratch, with uv
# (scripts/uv-pip.sh; `make venv` installs it). SYSTEM_PYTHON (default /usr/bin/python3),
# SANDBOX_UID (default 65534) and UV (default .venv/bin/uv) can be overridden.
set -euo pipefail

runtime_dir=${1:-.runtime/python}
requirements=${2:-runtime/python-requirements.txt}
system_python=${SYSTEM_PYTHON:-/usr/bin/python3}
sandbox_uid=${SANDBOX_UID:-65534}
uv=${UV:-.venv/bin/uv}

log() { echo "build-python-runtime: $*" >&2; }

if [ ! -x "$system_python" ]; then
    log "ERROR: $system_python not found (run scripts/install-system-deps.sh)"
    exit 1
fi
if [ ! -x "$uv" ]; then
    log "ERROR: $uv not found (run make venv, or set UV)"
    exit 1
fi
if [ ! -f "$requirements" ]; then
    log "ERROR: $requirements not found"
    exit 1
fi

log "creating $runtime_dir with $system_python ($("$system_python" -c 'import platform; print(platform.python_version())'))"
rm -rf "$runtime_dir"
mkdir -p "$(dirname "$runtime_dir")"
"$system_python" -m venv "$runtime_dir"

py="$runtime_dir/bin/python"
log "installing $requirements"
bash "$(dirname "$0")/uv-pip.sh" "$uv" "$py" install -r "$requirements"
bash "$(dirname "$0")/uv-pip.sh" "$uv" "$py" check

log "pre-compiling bytecode"
"$py" -m compileall -q -j 0 "$runtime_dir/lib" >/dev/null

# a+rX: read for all, and execute where someone already has it (directories, scripts).
chmod -R a+rX "$(dirname "$runtime_dir")"

imports='import numpy, pandas, matplotlib, requests, psycopg2'
"$py" -c "$imports"

# When root, prove the sandbox's uid can use it too, unless the path to it is closed to
# that uid anyway (scripts/check-sandbox-access.sh explains that case loudly).
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    abs_py="$(cd "$runtime_dir/bin" && pwd)/python3"
    # matplotlib wants a writable config dir (the sandbox must give it one too: MPLCONFIGDIR).
    mpl_dir=$(mktemp -d)
    trap 'rm -rf "$mpl_dir"' EXIT
    chown "$sandbox_uid:$sandbox_uid" "$mpl_dir"
    as_sandbox=(setpriv --reuid "$sandbox_uid" --regid "$sandbox_uid" --clear-groups
                env -i PATH=/usr/bin:/bin HOME=/nonexistent MPLCONFIGDIR="$mpl_dir")
    if "${as_sandbox[@]}" test -x "$abs_py"; then
        # cd / so a root-only working directory does not matter; stdin closed for the same reason.
        if ! (cd / && "${as_sandbox[@]}" "$abs_py" -B -c "$imports" </dev/null); then
            log "ERROR: uid $sandbox_uid cannot import the runtime's packages from $abs_py"
            exit 1
        fi
        log "uid $sandbox_uid can import: ${imports#import }"
    else
        log "skipping the uid $sandbox_uid import check: it cannot reach $abs_py"
    fi
fi

log "done: $("$py" -m pip freeze | tr '\n' ' ')"
