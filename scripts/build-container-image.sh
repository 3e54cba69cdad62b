#!/usr/bin/env bash
# Build the container backends' default image offline, from this Debian host's own packages.
#
#   scripts/build-container-image.sh [IMAGE] [EXTRA_DEBIAN_PACKAGE...]
#
# IMAGE defaults to localhost/mcp-sandbox-python:latest (the backends' default). The CLI is
# $CONTAINER_CLI, else podman, else docker. No registry is involved: scripts/container_rootfs.py
# copies Debian's python3 (and a shell, coreutils, ...) with their dependencies into a root
# filesystem, and `<cli> import` turns its tarball into an image. The sandbox's Python
# environment (.runtime/python: numpy, pandas, ...) stays on the host and is bound in at run time.
# With a registry, images/python/Containerfile builds a self-contained image instead.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/replaced-images.sh

image="${1:-localhost/mcp-sandbox-python:latest}"
shift || true
cli="${CONTAINER_CLI:-}"
if [ -z "$cli" ]; then
    cli="$(command -v podman || command -v docker || true)"
fi
if [ -z "$cli" ]; then
    echo "build-container-image: neither podman nor docker found (set CONTAINER_CLI)" >&2
    exit 1
fi

work="$(mktemp -d /tmp/mcp-sandbox-rootfs-XXXXXX)"
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 scripts/container_rootfs.py "$work/rootfs" "$@"
tar --numeric-owner -C "$work/rootfs" -cf "$work/rootfs.tar" .
replaced="$(image_id "$cli" "$image")"
"$cli" import \
    --change 'LABEL io.mcp-sandbox.image=python' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    "$work/rootfs.tar" "$image" >/dev/null
echo "build-container-image: built $image with $cli" >&2
remove_replaced "$cli" "$replaced" "$image" build-container-image
