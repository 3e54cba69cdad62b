#!/bin/bash
# The vm-test job, run as root in the guest at boot (from the read-write 9p share /mnt/ctl).
# Each step runs as the unprivileged user `sbx` (uid 1000), as a transient service of its own
# lingering user manager (like an app an MCP client starts), via guest-user.sh STEP, or as root
# (an operator's deployment) via guest-root.sh STEP; its output goes to /mnt/ctl/STEP.log and one
# line "STEP<TAB>pass|fail|skip<TAB>seconds" to results.tsv, which the host reads back. A failed
# step does not stop the later ones.
set -u
ctl=/mnt/ctl
results=$ctl/results.tsv
: > "$results"
uid=1000
user=sbx

# The podman backend's saved image (run.sh); mounted here rather than by the image's boot
# service so that adding it did not change the cached image.
mkdir -p /mnt/images
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro images /mnt/images

# The user's podman storage on kernel overlayfs (the guest's kernel mounts it in a user
# namespace), set before any step runs podman: the first podman call records its driver for
# good, and its default here, vfs, copies the whole image for every container (a minute per
# container start under emulation, past the backend probe's bound).
install -d -o "$user" -g "$user" "/home/$user/.config" "/home/$user/.config/containers"
printf '[storage]\ndriver = "overlay"\n' > "/home/$user/.config/containers/storage.conf"
chown "$user:$user" "/home/$user/.config/containers/storage.conf"

for _ in $(seq 300); do
    systemctl is-active --quiet "user@$uid.service" && [ -S /run/user/$uid/bus ] && break
    sleep 0.5
done
echo "user manager: $(systemctl is-active user@$uid.service) at $(cut -d' ' -f1 /proc/uptime) s"
# Where the boot's time went (systemd-analyze waits for the boot to finish, which this job is part of).
echo "boot: initrd to userspace $(systemctl show -p UserspaceTimestampMonotonic --value | awk '{printf "%.1f", $1 / 1e6}') s;" \
    "slowest units to start: $(systemctl list-units --type=service --state=active --no-legend --plain | awk '{print $1}' |
        xargs -r systemctl show -p Id -p ActiveEnterTimestampMonotonic -p InactiveExitTimestampMonotonic |
        awk -F= 'function unit() { if (v["Id"] != "" && v["ActiveEnterTimestampMonotonic"] > v["InactiveExitTimestampMonotonic"])
                     printf "%.1f %s\n", (v["ActiveEnterTimestampMonotonic"] - v["InactiveExitTimestampMonotonic"]) / 1e6, v["Id"]
                     delete v }
                 /^$/ {unit(); next} {v[$1] = $2} END {unit()}' |
        sort -rn | head -n 5 | tr '\n' ' ')"

# Whether VM_STEPS (run.sh) selects step $1 (all when it names none).
selected() { ! [ -s "$ctl/steps" ] || grep -qx "$1" "$ctl/steps"; }

# A step's line in results.tsv: NAME EXIT_CODE STARTED.
record() {
    local name=$1 rc=$2 started=$3 status
    case $rc in 0) status=pass ;; 77) status=skip ;; *) status=fail ;; esac
    printf '%s\t%s\t%s\n' "$name" "$status" "$(python3 -c "import sys; print(round($(date +%s.%N) - $started, 1))")" >> "$results"
    echo "step $name: $status (exit $rc)"
}

# One step as the user: STEP BOUND_SECONDS. The bound is the service's RuntimeMaxSec (emulated CPU: roomy).
step() {
    local name=$1 bound=$2 started rc
    selected "$name" || return 0
    started=$(date +%s.%N)
    runuser -u "$user" -- env XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus \
        systemd-run --user --quiet --wait --pipe --collect -p RuntimeMaxSec="$bound" \
        --working-directory=/home/$user -- bash /mnt/src/tests/vm/guest-user.sh "$name" \
        > "$ctl/$name.log" 2>&1 < /dev/null
    rc=$?
    record "$name" "$rc" "$started"
}

# One step as root: STEP BOUND_SECONDS (killed past it).
root_step() {
    local name=$1 bound=$2 started rc
    selected "$name" || return 0
    started=$(date +%s.%N)
    timeout --kill-after=30 "$bound" bash /mnt/src/tests/vm/guest-root.sh "$name" > "$ctl/$name.log" 2>&1 < /dev/null
    rc=$?
    record "$name" "$rc" "$started"
}

step user-manager 120
step install 900
step setup 1200
step runtime-fallback 1200
step doctor 900
step conformance 1800
step e2e-stdio 1200
step install-print 300
step client-config 600
root_step systemd-unit 1200
step podman-rootless 1500
echo "job done at $(cut -d' ' -f1 /proc/uptime) s"
