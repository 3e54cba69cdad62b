#!/usr/bin/env bash
# mmdebstrap's customize hook for build-image.sh: runs on the host with the guest's root as $1.
# The unprivileged user (uid 1000, lingering user manager, subordinate ids), the host's CA
# certificates (registries are reached through a TLS-intercepting proxy here), uv, and the job
# service that runs /mnt/ctl/job.sh from a 9p share at boot and powers off.
set -euo pipefail
root=$1
here=$(cd "$(dirname "$0")" && pwd)

echo mcpvm > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 mcpvm\n' > "$root/etc/hosts"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
chroot "$root" update-ca-certificates >/dev/null

chroot "$root" useradd --create-home --uid 1000 --shell /bin/bash sbx
grep -q '^sbx:' "$root/etc/subuid" || echo 'sbx:100000:65536' >> "$root/etc/subuid"
grep -q '^sbx:' "$root/etc/subgid" || echo 'sbx:100000:65536' >> "$root/etc/subgid"
mkdir -p "$root/var/lib/systemd/linger"
touch "$root/var/lib/systemd/linger/sbx"  # what `loginctl enable-linger sbx` does

# uv (the one binary of its PyPI wheel) installs the wheel and builds venvs in the guest: pip
# runs 5-10x slower there under emulation.
uv_dir=$(mktemp -d)
"${PIP_PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --dest "$uv_dir" 'uv==0.9.*'
"${PIP_PYTHON:-python3}" -m zipfile -e "$uv_dir"/uv-*.whl "$uv_dir/x"
install -m 0755 "$uv_dir"/x/uv-*.data/scripts/uv "$root/usr/local/bin/uv"
rm -rf "$uv_dir"

install -m 0755 "$here/mcp-vm-job" "$root/usr/local/sbin/mcp-vm-job"
install -m 0644 "$here/mcp-vm-job.service" "$root/etc/systemd/system/mcp-vm-job.service"
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/mcp-vm-job.service "$root/etc/systemd/system/multi-user.target.wants/"
# Nothing to wait for at boot: no network, no getty on the serial console's login prompt, no
# root containers for podman-restart to start (it starts podman at boot, under emulation, beside
# the job's first steps).
chroot "$root" systemctl mask systemd-networkd-wait-online.service serial-getty@ttyS0.service podman-restart.service \
    apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer >/dev/null 2>&1 || true
