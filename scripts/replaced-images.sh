# Sourced by scripts/build-container-image.sh and scripts/build-server-image.sh: an image that a
# build replaced is removed, so upgrades do not pile up images (the server's is about 790 MB).
# Nothing is forced: an image a container (running or stopped) or another tag still uses is kept,
# and the build says so.

# image_id CLI IMAGE: the image's id, or nothing when there is no such image.
image_id() {
    "$1" image inspect --format '{{.Id}}' "$2" 2>/dev/null || true
}

# remove_replaced CLI OLD_ID IMAGE WHO: remove OLD_ID (IMAGE's id before the build) if IMAGE is now
# another image.
remove_replaced() {
    local cli="$1" old="$2" image="$3" who="$4"
    [ -n "$old" ] || return 0
    [ "$old" != "$(image_id "$cli" "$image")" ] || return 0
    if "$cli" rmi "$old" >/dev/null 2>&1; then
        echo "$who: removed the image $image replaced (${old#sha256:})" >&2
    else
        echo "$who: kept the image $image replaced (${old#sha256:}): a container or another tag uses it" >&2
    fi
}

# remove_other_tags CLI REPOSITORY KEEP WHO: remove REPOSITORY's tags other than KEEP (an image
# used by another image, a container or another tag is kept).
remove_other_tags() {
    local cli="$1" repository="$2" keep="$3" who="$4" tag
    "$cli" images --format '{{.Repository}}:{{.Tag}}' "$repository" 2>/dev/null | while read -r tag; do
        if [ "$tag" != "$keep" ] && [ "$tag" != "$repository:<none>" ]; then
            if "$cli" rmi "$tag" >/dev/null 2>&1; then
                echo "$who: removed $tag, which an earlier build made" >&2
            fi
        fi
    done
}
