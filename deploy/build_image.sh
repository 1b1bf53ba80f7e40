#!/usr/bin/env bash
# Builds the Estuary image with no image registry (only Debian's mirror) and serves one request
# from it:
#   1. debootstrap makes a Debian 12 minbase root file system, imported as the base image
#      (localhost/estuary-debian:12; cached, rebuilt only when missing);
#   2. `podman build --isolation chroot -f deploy/Dockerfile` builds localhost/estuary:dev on it;
#   3. the image's file system (podman image mount) runs under chroot in a network namespace of
#      its own, as the non-root user the image names: estuary-router and estuary-decode on the
#      shipped stories260K, then `estuary client` sends one greedy request through the router.
# Prints the build time and the image size. Needs root, podman, debootstrap (Debian packages).
#
#   deploy/build_image.sh [--skip-build]      (--skip-build: only step 3, on the built image)
#   deploy/build_image.sh --base-only         (only step 1: scripts/test.sh runs it while
#                                              build/ compiles, as it waits on the network)
set -euo pipefail
cd "$(dirname "$0")/.."
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base=localhost/estuary-debian:12
image="${IMAGE:-localhost/estuary:dev}"
work="${WORK_DIR:-/var/tmp/estuary-image}"
skip_build=0
base_only=0
case "${1:-}" in
  "") ;;
  --skip-build) skip_build=1 ;;
  --base-only) base_only=1 ;;
  *) echo "unknown argument $1 (--skip-build | --base-only)" >&2; exit 2 ;;
esac

need() { command -v "$1" >/dev/null || { echo "needs $1 (apt-get install $2)" >&2; exit 1; }; }
need podman podman
need debootstrap debootstrap
need ip iproute2
[ "$(id -u)" -eq 0 ] || { echo "needs root (debootstrap, namespaces, chroot)" >&2; exit 1; }
mkdir -p "$work"

if [ "$skip_build" -eq 0 ]; then
  if ! podman image exists "$base"; then
    echo "== debootstrap: Debian 12 minbase from $mirror"
    rm -rf "$work/rootfs"
    start=$(date +%s)
    debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
      || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    # Debian's security and point-release updates besides the release itself, as on any
    # maintained Debian 12 host: the image gets the fixed packages, and the same versions of the
    # headers as an up-to-date host (which lets its build reuse the host's compiler cache).
    cat > "$work/rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
EOF
    tar -C "$work/rootfs" -c . | podman import - "$base" > /dev/null
    rm -rf "$work/rootfs"
    echo "   base image $base in $(( $(date +%s) - start )) s"
  fi
  [ "$base_only" -eq 0 ] || exit 0
  echo "== podman build (chroot isolation)"
  start=$(date +%s)
  # The host's compiler cache, when it has one, serves the image's compilations (the same
  # Debian 12 compiler; deploy/build_release.sh): in CI, build/ has just compiled nearly all of
  # them. Only the build stage reads it; nothing of it enters the image.
  cache_mount=()
  if command -v ccache > /dev/null; then
    cache_dir="$(ccache -k cache_dir)"
    mkdir -p "$cache_dir"
    cache_mount=(--volume "$cache_dir:/ccache")
  fi
  podman build --isolation chroot --build-arg BASE_IMAGE="$base" "${cache_mount[@]}" \
    -f deploy/Dockerfile -t "$image" . > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }
  grep -E '^ *(Hits|Misses)' "$work/build.log" | sed 's/^ */   compiler cache: /' || true
  build_seconds=$(( $(date +%s) - start ))
  echo "   built $image in ${build_seconds} s"
fi
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "   image size: $(( size / 1024 / 1024 )) MiB"

echo "== serving one request from the image's file system"
root="$(podman image mount "$image")"
ns="estimg$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  podman image unmount "$image" > /dev/null 2>&1 || true
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
# One process of the image: its own mount and pid namespaces, /dev, /proc, /sys (UCX lists the
# network devices there) and a /tmp, chrooted
# into the image as uid 10001 (the image's USER).
in_image() {
  ip netns exec "$ns" unshare --mount --pid --fork bash -c '
    root="$1"; shift
    mount --make-rprivate /
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount -t tmpfs tmpfs "$root/tmp"
    exec chroot --userspec=10001:10001 "$root" "$@"' in_image "$root" "$@"
}
model=/opt/estuary/models/stories260K
in_image /usr/local/bin/estuary-router --model "$model" --port 50051 > "$work/router.log" 2>&1 &
pids+=($!)
in_image /usr/local/bin/estuary-decode --model "$model" --port 50060 --router 127.0.0.1:50051 \
  --ucx-tls tcp --kv-cache-bytes 33554432 > "$work/decode.log" 2>&1 &
pids+=($!)
answer=""
for _ in $(seq 100); do
  if answer="$(in_image /usr/local/bin/estuary client --server 127.0.0.1:50051 \
      --prompt "Once upon a time" --max-tokens 40 --temperature 0 2>&1)"; then
    break
  fi
  answer=""
  sleep 0.3
done
if [ -z "$answer" ]; then
  echo "no answer from the image's cluster; logs:" >&2
  tail -n 20 "$work/router.log" "$work/decode.log" >&2
  exit 1
fi
echo "$answer"
echo "== ok: $image (${size} bytes) served a request${build_seconds:+; build ${build_seconds} s}"
