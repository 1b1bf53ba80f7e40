#!/usr/bin/env bash
# Builds Estuary (build/, Release); when nvcc is on the machine, also compiles a second build
# with the CUDA backend (build-cuda/) and runs its gpu-labelled tests (they skip without a
# device); runs the libFuzzer targets for FUZZ_SECONDS each (default 60); builds the container
# image and serves a request from it (deploy/build_image.sh); and runs every test
# that needs no GPU last, so that the closing lines CI reads are the full suite's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed as it ends, so that CI's log says where its minutes went.
phase_start=$SECONDS
phase_done() {
  echo "== test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"
  phase_start=$SECONDS
}
# Layering first (seconds, nothing compiled): each target includes only what it links.
python3 scripts/check_layering.py
# The image (deploy/build_image.sh, below) needs root, podman and debootstrap; its base file
# system (debootstrap, 1.5-2.5 minutes, mostly waiting on Debian's mirror) is made in the
# background while build/ compiles. ESTUARY_SKIP_IMAGE=1 skips the image.
image_skip_reason=""
if [ "${ESTUARY_SKIP_IMAGE:-0}" = 1 ]; then
  image_skip_reason="ESTUARY_SKIP_IMAGE=1"
elif [ "$(id -u)" -ne 0 ]; then
  image_skip_reason="not root (deploy/build_image.sh needs root)"
fi
base_image_pid=""
if [ -z "$image_skip_reason" ]; then
  bash scripts/install_deps.sh podman debootstrap
  mkdir -p build
  bash deploy/build_image.sh --base-only > build/base_image.log 2>&1 &
  base_image_pid=$!
fi
bash scripts/build.sh
phase_done "build/"
# What only tests need: python3-yaml and iproute2 (the pods-as-written and multi-node tests);
# openssl (the security tests make their CA and certificates at test time); node with npm where
# the machine has none (the manifests' schema check, deploy/validate).
test_packages=(python3-yaml iproute2 python3-prometheus-client openssl)
command -v node > /dev/null || test_packages+=(nodejs npm)
bash scripts/install_deps.sh "${test_packages[@]}"

nvcc_path="$(command -v nvcc || true)"
[ -n "$nvcc_path" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc_path=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_path" ]; then
  echo "nvcc found at $nvcc_path: compiling the CUDA build in build-cuda/"
  source scripts/compiler_cache.sh  # build/'s objects serve most of this build's host code
  # Device code for sm_90 only (the H200 the GPU checks run on; ESTUARY_CUDA_ARCHITECTURES
  # overrides): the kernels have no per-architecture branch, and the shipped default "90;80"
  # compiles every .cu file twice.
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" -DESTUARY_BENCHMARKS=OFF "${compiler_cache_flags[@]}" \
    -DESTUARY_CUDA_ARCHITECTURES="${ESTUARY_CUDA_ARCHITECTURES:-90}" >/dev/null
  # ESTUARY_CUDA adds the CUDA backend, kernels, the device forward pass and NCCL: build every
  # gpu-labelled test binary (with the worker binaries gpu_cluster_test starts) and `estuary`.
  cmake --build build-cuda --parallel "$(nproc)" --target estuary_model gpu_tests estuary
  (cd build-cuda && ctest --output-on-failure --label-regex gpu --timeout 300)
  phase_done "the CUDA build and its gpu tests"
else
  echo "no nvcc: skipping the CUDA build"
fi

bash scripts/fuzz.sh
phase_done "the fuzzers"

# The image: built from deploy/Dockerfile without a registry, its compilations served by the
# compiler cache build/ filled, then serving one request from its file system
# (deploy/build_image.sh). Where it cannot run, says why and goes on.
if [ -n "$image_skip_reason" ]; then
  echo "not building the image: $image_skip_reason"
else
  # The base image made in the background; if that failed, build_image.sh makes it again.
  wait "$base_image_pid" || echo "the background base image failed; retrying"
  cat build/base_image.log
  bash deploy/build_image.sh
fi
phase_done "the image"

# Last, so that its summary (with ctest's own "Total Test time") closes the log.
(cd build && ctest --output-on-failure --label-exclude gpu --timeout 600 -j "$(nproc)")
