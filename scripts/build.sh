#!/usr/bin/env bash
# Configures and builds Estuary in build/ (Release, all cores). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
source scripts/compiler_cache.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${compiler_cache_flags[@]}" "$@" >/dev/null
cmake --build build --parallel "$(nproc)"
