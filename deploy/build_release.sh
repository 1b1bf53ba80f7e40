#!/bin/sh
# The image's build step (deploy/Dockerfile's build and cuda-build stages), run from the
# source root: a Release build of the four binaries, installed (stripped) into /opt/estuary,
# and /opt/estuary/runtime-packages: the Debian packages the runtime stage must install for
# them (runtime_packages.sh).
#
#   deploy/build_release.sh [CMAKE_ARG...]        e.g. -DESTUARY_CUDA=ON
set -eu
# The build folder sits in the source root, as the host's build/ does, so that with a compiler
# cache mounted at /ccache (deploy/build_image.sh mounts the host's when the host has ccache)
# paths relative to the source root hash alike and the host's compilations are reused; the
# compiler is the same Debian 12 package on both sides. Without /ccache it is a plain build.
build="$(pwd)/build"
if [ -d /ccache ] && command -v ccache > /dev/null; then
  export CCACHE_DIR=/ccache CCACHE_BASEDIR="$(pwd)" CCACHE_SLOPPINESS=locale  # as the host's
  ccache --zero-stats > /dev/null  # the line printed below counts this build only
  set -- -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "$@"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_TESTS=OFF \
  -DESTUARY_BENCHMARKS=OFF -DCMAKE_INSTALL_PREFIX=/opt/estuary "$@"
cmake --build "$build" --parallel "$(nproc)" \
  --target estuary-router estuary-prefill estuary-decode estuary
cmake --install "$build" --strip
[ -z "${CCACHE_DIR:-}" ] || ccache --show-stats | grep -E 'Hits|Misses' || true
rm -rf "$build"
sh deploy/runtime_packages.sh /opt/estuary/bin/* > /opt/estuary/runtime-packages
