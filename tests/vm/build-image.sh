#!/usr/bin/env bash
# Build the systemd guest `make vm-test` boots: Debian 12 from Debian's own packages.
#
#   tests/vm/build-image.sh OUT_DIR
#
# OUT_DIR gets rootfs.img (a sparse raw ext4 image), vmlinuz and initrd.img, and a stamp: the hash
# of this script and of the files it copies in. With a matching stamp nothing is rebuilt.
# Needs root, mmdebstrap and e2fsprogs (scripts/install-system-deps.sh ... see the Makefile's
# vm-test target). The mirror is the one this host's apt uses (never written into the repo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-image.sh OUT_DIR}
mkdir -p "$out"
log() { echo "build-image: $*" >&2; }

inputs=("$here/build-image.sh" "$here/customize.sh" "$here/mcp-vm-job.service" "$here/mcp-vm-job")
stamp=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && [ -f "$out/rootfs.img" ]; then
    log "image up to date ($stamp)"
    exit 0
fi

# The mirrors this host's apt uses: the URIs of /etc/apt/sources.list.d/debian.sources (deb822),
# else the deb lines of /etc/apt/sources.list.
mirrors=()
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mapfile -t uris < <(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/debian.sources)
    for uri in "${uris[@]}"; do
        case $uri in
            *security*) mirrors+=("deb $uri bookworm-security main") ;;
            *) mirrors+=("deb $uri bookworm main" "deb $uri bookworm-updates main") ;;
        esac
    done
else
    mapfile -t mirrors < <(grep -h '^deb ' /etc/apt/sources.list)
fi
[ ${#mirrors[@]} -gt 0 ] || { log "ERROR: no apt mirror found on this host"; exit 1; }

packages=(
    systemd systemd-sysv dbus dbus-user-session libpam-systemd udev kmod
    linux-image-amd64 initramfs-tools zstd procps iproute2 ca-certificates sudo
    bubblewrap libseccomp2 python3 python3-venv git make
    podman uidmap slirp4netns crun fuse-overlayfs
)
# A build killed before its end (mmdebstrap killed with it) leaves its root's /proc, /sys and /dev
# mounted under the directory: each is unmounted before the directory is removed, and the removal
# never crosses into another filesystem (a bound host /dev would lose its nodes).
remove_build() {
    local dir="$1" mount
    findmnt -rn -o TARGET | awk -v dir="$dir/" 'index($0, dir) == 1' | sort -r | while read -r mount; do
        umount -l "$mount" || true
    done
    rm -rf --one-file-system "$dir"
}
for stale in "$out"/build.*; do
    [ -d "$stale" ] && remove_build "$stale"
done
work=$(mktemp -d "$out/build.XXXXXX")
trap 'remove_build "$work"' EXIT
started=$(date +%s)
log "mmdebstrap bookworm (${#packages[@]} packages)"
mmdebstrap --variant=minbase --quiet \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$(IFS=,; echo "${packages[*]}")" \
    --customize-hook="bash '$here/customize.sh' \"\$1\"" \
    bookworm "$work/root" "${mirrors[@]}"
cp "$work"/root/boot/vmlinuz-* "$work/vmlinuz"
cp "$work"/root/boot/initrd.img-* "$work/initrd.img"
rm -f "$work/rootfs.img"
mkfs.ext4 -q -L root -d "$work/root" "$work/rootfs.img" 6G
mv "$work/vmlinuz" "$work/initrd.img" "$work/rootfs.img" "$out/"
echo "$stamp" > "$out/stamp"
log "built $out/rootfs.img in $(( $(date +%s) - started )) s ($(du -sh "$out/rootfs.img" | cut -f1) used)"
