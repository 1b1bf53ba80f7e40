#!/bin/sh
# The image's build step (deploy/Dockerfile's build and cuda-build stages), run from the
# source root: a Release build of the four binaries, installed (stripped) into /opt/estuary,
# and /opt/estuary/runtime-packages: the Debian packages the runtime stage must install for
# them (runtime_packages.sh).
#
#   deploy/build_release.sh [CMAKE_ARG...]        e.g. -DESTUARY_CUDA=ON
set -eu
cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_TESTS=OFF \
  -DESTUARY_BENCHMARKS=OFF -DCMAKE_INSTALL_PREFIX=/opt/estuary "$@"
cmake --build /build --parallel "$(nproc)" \
  --target estuary-router estuary-prefill estuary-decode estuary
cmake --install /build --strip
sh deploy/runtime_packages.sh /opt/estuary/bin/* > /opt/estuary/runtime-packages
