#!/usr/bin/env bash
# Build the server's own container image offline, from this Debian host's packages.
#
#   scripts/build-server-image.sh [IMAGE]
#   scripts/build-server-image.sh --digest        # print the digest of what goes in, and exit
#   scripts/build-server-image.sh --base-digest   # the same, of what goes in but src/
#
# The image is two layers. The base, named localhost/mcp-sandbox-server-base:<base digest> and
# kept in the engine, holds all but the server's own package: it is rebuilt only when the pins or
# these scripts change. The top holds the package (src/, compiled): a change to the source
# rebuilds only it, with `<cli> build` from the base (no RUN step: no container is started).
# With SERVER_IMAGE_TAR=PATH, the base's root filesystem tarball is kept at PATH, and an existing
# one is imported instead of building again (the tests load one build into both podman and
# docker; the caller names PATH after the base digest).
# IMAGE defaults to localhost/mcp-sandbox:latest. The CLI is $CONTAINER_CLI, else podman, else
# docker. As for the sandbox image (scripts/build-container-image.sh), no image registry is
# involved: scripts/container_rootfs.py copies Debian's python3, bubblewrap, libseccomp (with
# ldconfig, which ctypes uses to find it) and tini
# with their dependencies into a root filesystem. Into it go
#   /opt/mcp-sandbox/.venv           the server: this repository's wheel and its dependencies,
#                                    with the postgres and s3 extras
#                                    (pip, from the package index pip is configured with)
#   /opt/mcp-sandbox/.runtime/python the sandbox's Python runtime (a copy of .runtime/python)
#   /opt/mcp-sandbox/.runtime/js     bun and deno (a copy of .runtime/js)
#   /opt/mcp-sandbox/.runtime/gate   the sandbox's gate, static (a copy of .runtime/gate, if built)
#   /var/lib/mcp-sandbox             the state directory (a volume), owned by the server's user
# and the image's default command serves HTTP on 0.0.0.0:8765 as the unprivileged user
# mcp-sandbox (uid 10001). deploy/compose.yaml runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/replaced-images.sh

# What the image is made of: the image carries it as a label, so a stale image can be told
# (tests/deploy/test_image.py rebuilds when it differs).
base_inputs() {
    sha256sum pyproject.toml scripts/build-server-image.sh scripts/container_rootfs.py \
        runtime/python-requirements.txt runtime/js/package-lock.json
}
base_digest() {
    base_inputs | sha256sum | cut -c1-32
}
digest() {
    {
        find src -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
        base_inputs
    } | sha256sum | cut -c1-32
}
case "${1:-}" in
    --digest) digest; exit 0 ;;
    --base-digest) base_digest; exit 0 ;;
esac

image="${1:-localhost/mcp-sandbox:latest}"
cli="${CONTAINER_CLI:-}"
if [ -z "$cli" ]; then
    cli="$(command -v podman || command -v docker || true)"
fi
if [ -z "$cli" ]; then
    echo "build-server-image: neither podman nor docker found (set CONTAINER_CLI)" >&2
    exit 1
fi
for needed in .venv/bin/python .runtime/python/bin/python3 .runtime/js/.installed; do
    if [ ! -e "$needed" ]; then
        echo "build-server-image: $needed is missing (run make setup first)" >&2
        exit 1
    fi
done

uid=10001
prefix=/opt/mcp-sandbox
work="$(mktemp -d /tmp/mcp-sandbox-server-rootfs-XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
tarball="${SERVER_IMAGE_TAR:-$work/rootfs.tar}"
base="localhost/mcp-sandbox-server-base:$(base_digest)"
py_version="$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
site_packages="$prefix/.venv/lib/python$py_version/site-packages"
.venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" .
wheel="$(ls "$work"/wheels/*.whl)"

build_rootfs() {
    /usr/bin/python3 scripts/container_rootfs.py "$rootfs" bubblewrap libseccomp2 libc-bin tini ca-certificates

    # The server's environment: a venv of the image's python3 (the host's Debian one, copied above)
    # with the wheel's dependencies installed into it; the wheel itself is the top layer's. Bytecode
    # is compiled now: the root filesystem is read-only at run time.
    /usr/bin/python3 -m venv --without-pip "$rootfs$prefix/.venv"
    ln -sfn /usr/bin/python3 "$rootfs$prefix/.venv/bin/python3"
    ln -sfn python3 "$rootfs$prefix/.venv/bin/python"
    # With the extras replicas use (database_url: psycopg; object_store_url: boto3): the Kubernetes
    # manifests run this image as replicas (docs/scaling.md).
    .venv/bin/python -m pip install --quiet --no-warn-script-location --python-version "$py_version" \
        --only-binary=:all: --target "$rootfs$site_packages" "$wheel[postgres,s3,otel]"
    rm -rf "$rootfs$site_packages"/mcp_sandbox "$rootfs$site_packages"/mcp_sandbox-*.dist-info
    /usr/bin/python3 -m compileall -q "$rootfs$site_packages" || true
    mkdir -p "$rootfs/usr/local/bin"
    cat >"$rootfs/usr/local/bin/mcp-sandbox" <<EOF
#!/bin/sh
exec $prefix/.venv/bin/python -m mcp_sandbox "\$@"
EOF
    chmod 755 "$rootfs/usr/local/bin/mcp-sandbox"

    # The sandbox's runtimes, at the paths the settings' defaults derive from the venv's.
    mkdir -p "$rootfs$prefix/.runtime"
    # (Links are kept: the runtime venv's interpreter links point at Debian's python3, in the image too.)
    cp -a .runtime/python/. "$rootfs$prefix/.runtime/python"
    cp -a .runtime/js/. "$rootfs$prefix/.runtime/js"
    # The sandbox's gate (static, so it runs in the image as built here), when setup built it.
    if [ -d .runtime/gate ]; then
        cp -a .runtime/gate/. "$rootfs$prefix/.runtime/gate"
    fi
    chmod -R a+rX,go-w "$rootfs$prefix"

    # The unprivileged user the server runs as, its home and the state directory (a volume).
    etc="$rootfs/etc"
    echo "mcp-sandbox:x:$uid:$uid:mcp-sandbox:/home/mcp-sandbox:/bin/sh" >>"$etc/passwd"
    echo "mcp-sandbox:x:$uid:" >>"$etc/group"
    mkdir -p "$rootfs/home/mcp-sandbox" "$rootfs/var/lib/mcp-sandbox"
    chown "$uid:$uid" "$rootfs/home/mcp-sandbox" "$rootfs/var/lib/mcp-sandbox"
    chmod 700 "$rootfs/home/mcp-sandbox" "$rootfs/var/lib/mcp-sandbox"

    tar --numeric-owner -C "$rootfs" -cf "$work/rootfs.tar" .
    if [ "$tarball" != "$work/rootfs.tar" ]; then
        mv "$work/rootfs.tar" "$tarball.partial" && mv "$tarball.partial" "$tarball"
    fi
}

if ! "$cli" image inspect "$base" >/dev/null 2>&1; then
    if [ ! -s "$tarball" ]; then
        build_rootfs
    fi
    "$cli" import "$tarball" "$base" >/dev/null
fi

# The top layer: the server's package, compiled, readable by all and writable by none.
top="$work/top"
.venv/bin/python -m pip install --quiet --no-deps --no-warn-script-location --python-version "$py_version" \
    --only-binary=:all: --target "$top/site-packages" "$wheel"
/usr/bin/python3 -m compileall -q "$top/site-packages" || true
chmod -R a+rX,go-w "$top"
cat >"$top/Containerfile" <<EOF
FROM $base
COPY site-packages/ $site_packages/
LABEL io.mcp-sandbox.image=server
LABEL io.mcp-sandbox.digest=$(digest)
ENV PATH=/usr/local/bin:/usr/bin:/bin
ENV HOME=/home/mcp-sandbox
ENV MCP_SANDBOX_STATE_DIR=/var/lib/mcp-sandbox
ENV MCP_SANDBOX_HOST=0.0.0.0
ENV MCP_SANDBOX_PORT=8765
USER $uid:$uid
WORKDIR /home/mcp-sandbox
VOLUME /var/lib/mcp-sandbox
EXPOSE 8765
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/mcp-sandbox"]
CMD ["serve", "--transport", "http"]
EOF
# docker's own builder: BuildKit needs the buildx plugin, which Debian's docker.io may lack.
replaced="$(image_id "$cli" "$image")"
DOCKER_BUILDKIT=0 "$cli" build --quiet --pull=false -f "$top/Containerfile" -t "$image" "$top" >/dev/null
echo "build-server-image: built $image with $cli" >&2
remove_replaced "$cli" "$replaced" "$image" build-server-image
remove_other_tags "$cli" "${base%:*}" "$base" build-server-image
