#!/usr/bin/env bash
# Builds Estuary (build/, Release) and runs every test that needs no GPU; then, when nvcc is on
# the machine, configures and compiles a second build with the CUDA backend (build-cuda/), and
# runs the libFuzzer targets for FUZZ_SECONDS each (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd build && ctest --output-on-failure --label-exclude gpu --timeout 600 -j "$(nproc)")

nvcc_path="$(command -v nvcc || true)"
[ -n "$nvcc_path" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc_path=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_path" ]; then
  echo "nvcc found at $nvcc_path: compiling the CUDA build in build-cuda/"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" -DESTUARY_BENCHMARKS=OFF >/dev/null
  cmake --build build-cuda --parallel "$(nproc)"
  (cd build-cuda && ctest --output-on-failure --label-regex gpu --timeout 300)
else
  echo "no nvcc: skipping the CUDA build"
fi

bash scripts/fuzz.sh
