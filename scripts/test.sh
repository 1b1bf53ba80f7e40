#!/usr/bin/env bash
# Builds Estuary (build/, Release); when nvcc is on the machine, also compiles a second build
# with the CUDA backend (build-cuda/) and runs its gpu-labelled tests (they skip without a
# device); runs the libFuzzer targets for FUZZ_SECONDS each (default 60); and runs every test
# that needs no GPU last, so that the closing lines CI reads are the full suite's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh

nvcc_path="$(command -v nvcc || true)"
[ -n "$nvcc_path" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc_path=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_path" ]; then
  echo "nvcc found at $nvcc_path: compiling the CUDA build in build-cuda/"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" -DESTUARY_BENCHMARKS=OFF >/dev/null
  # ESTUARY_CUDA adds the CUDA backend, kernels, the device forward pass and NCCL: build every
  # gpu-labelled test binary (with the worker binaries gpu_cluster_test starts) and `estuary`.
  cmake --build build-cuda --parallel "$(nproc)" --target estuary_model gpu_tests estuary
  (cd build-cuda && ctest --output-on-failure --label-regex gpu --timeout 300)
else
  echo "no nvcc: skipping the CUDA build"
fi

bash scripts/fuzz.sh

(cd build && ctest --output-on-failure --label-exclude gpu --timeout 600 -j "$(nproc)")
