#!/usr/bin/env bash
# Builds the CUDA build here (build-cuda/: the gpu_tests target, the router and worker binaries
# and estuary-gpu-bench when it exists) and packs what a GPU machine without Debian -dev packages
# needs into .gpu-bundle/ (git-ignored), for tests/gpu/run.sh there:
#   bin.tar.xz        bin/: every gpu-labelled test binary and estuary-gpu-bench, stripped;
#                     build/: router/estuary-router, prefill/estuary-prefill and
#                     decode/estuary-decode, stripped, laid out like build-cuda/: the processes
#                     gpu_cluster_test starts (run.sh points ESTUARY_BINARY_DIR there);
#   tests.tsv         how to run them, from `ctest --show-only=json-v1 -L gpu`;
#   lib.tar.xz        lib/: the shared libraries they need (Abseil, gRPC, Protobuf, UCX, OpenSSL,
#                     OpenBLAS, Highway, cudart...; not UCX's lib/ucx/ modules: the workers' tcp
#                     transport is built into libuct);
#                     lib-fallback/: libstdc++ and libgcc_s, used there only if the system's are
#                     missing or too old;
#   machine-libs.txt  libraries taken from the GPU machine (cuBLAS, NCCL): too big to carry;
#   models/           the repository's models/ folders the tests read;
#   INFO              commit, compiler and contents.
# Not carried: glibc (libc, libm, libpthread, libdl, librt, ld-linux) and the driver (libcuda,
# libnvidia-*). Environment: JOBS (build jobs, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
build="build-cuda"
bundle=.gpu-bundle
stage=.gpu-bundle.tmp
bench_name=estuary-gpu-bench
# The processes that gpu_cluster_test starts (tests/e2e/cluster.cc), relative to the build folder.
worker_bins=(router/estuary-router prefill/estuary-prefill decode/estuary-decode)

nvcc_path="$(command -v nvcc || true)"
[ -n "$nvcc_path" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc_path=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc_path" ]; then
  echo "gpu_bundle: no nvcc (looked on PATH and in /usr/local/cuda/bin)" >&2
  exit 1
fi

echo "== configuring and building $build/ (gpu_tests, the router and workers) with $nvcc_path"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc_path" -DESTUARY_BENCHMARKS=OFF >/dev/null
targets=(gpu_tests)
for worker in "${worker_bins[@]}"; do targets+=("$(basename "$worker")"); done
if ninja -C "$build" -t targets all | grep -q "^$bench_name: "; then
  targets+=("$bench_name")
fi
cmake --build "$build" --parallel "${JOBS:-$(nproc)}" --target "${targets[@]}"

ctest_json="$(mktemp)"
trap 'rm -f "$ctest_json"; rm -rf "$root/$stage"' EXIT
(cd "$build" && ctest --show-only=json-v1 -L gpu) >"$ctest_json"
mapfile -t test_exes < <(python3 tests/gpu/manifest.py executables --ctest-json "$ctest_json")
if [ "${#test_exes[@]}" -eq 0 ]; then
  echo "gpu_bundle: ctest lists no gpu-labelled test in $build/" >&2
  exit 1
fi
# A gpu_tests binary that ctest lists no case of (no tests yet, or discovery failed) is left out.
while read -r target; do
  case "$target" in */"$bench_name" | "$bench_name") continue ;; esac
  if ! printf '%s\n' "${test_exes[@]}" | grep -qxF "$root/$build/$target"; then
    echo "gpu_bundle: WARNING: ctest lists no case of $target (in gpu_tests): left out"
  fi
done < <(ninja -C "$build" -t query gpu_tests | sed -n '/input:/,/outputs:/p' | sed '1d;$d;s/^ *//')
bench_exe="$(find "$build" -type f -name "$bench_name" -perm -u+x -print -quit)"
if [ -z "$bench_exe" ]; then
  echo "gpu_bundle: WARNING: no $bench_name in $build/ (not written yet?): the bundle has no benchmark"
fi

for worker in "${worker_bins[@]}"; do
  if [ ! -x "$build/$worker" ]; then
    echo "gpu_bundle: no $build/$worker after the build" >&2
    exit 1
  fi
done

rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$stage/models"
python3 tests/gpu/manifest.py tests --ctest-json "$ctest_json" --source-dir . --bundle \
  >"$stage/tests.tsv"
exes=("${test_exes[@]}")
[ -z "$bench_exe" ] || exes+=("$bench_exe")
for exe in "${exes[@]}"; do
  cp "$exe" "$stage/bin/"
  strip --strip-unneeded "$stage/bin/$(basename "$exe")"
done
for worker in "${worker_bins[@]}"; do
  mkdir -p "$stage/build/$(dirname "$worker")"
  cp "$build/$worker" "$stage/build/$worker"
  strip --strip-unneeded "$stage/build/$worker"
  exes+=("$root/$build/$worker")
done

# Shared libraries, by soname, from ldd's transitive list.
is_glibc_or_driver() {
  case "$1" in
    linux-vdso.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
      ld-linux*.so.* | libcuda.so.* | libnvidia-*) return 0 ;;
  esac
  return 1
}
is_machine_cuda() {
  case "$1" in
    libcublas.so.* | libcublasLt.so.* | libnccl.so.*) return 0 ;;
  esac
  return 1
}
declare -A machine_libs=()
for exe in "${exes[@]}"; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "gpu_bundle: $exe: $soname not found here" >&2
      exit 1
    fi
    if is_glibc_or_driver "$soname"; then
      continue
    elif is_machine_cuda "$soname"; then
      machine_libs[$soname]=1
    elif [ "$soname" = libstdc++.so.6 ] || [ "$soname" = libgcc_s.so.1 ]; then
      cp -L "$path" "$stage/lib-fallback/$soname"
    else
      cp -L "$path" "$stage/lib/$soname"
    fi
  done < <(ldd "$exe")
done
printf '%s\n' "${!machine_libs[@]}" | sort >"$stage/machine-libs.txt"

mapfile -t models < <(python3 tests/gpu/manifest.py models --build-dir "$build" --source-dir . \
  "${test_exes[@]}")
for model in "${models[@]}"; do
  cp -rL "models/$model" "$stage/models/$model"
done

# Every library of every binary must come from the bundle or be one the GPU machine has.
echo "== checking that every library resolves to the bundle or to the GPU machine's own"
unresolved=0
for exe in "$stage"/bin/* "${worker_bins[@]/#/$stage/build/}"; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in
      "$root/$stage/lib/"*) continue ;;
    esac
    if is_glibc_or_driver "$soname" || is_machine_cuda "$soname" ||
      [ -e "$stage/lib-fallback/$soname" ]; then
      continue
    fi
    echo "  $(basename "$exe"): $soname -> $path (neither bundled nor on the GPU machine)"
    unresolved=1
  done < <(LD_LIBRARY_PATH="$root/$stage/lib" ldd "$exe")
done
[ "$unresolved" -eq 0 ] || exit 1

# The tree that travels to the GPU machine, carried paths included, is limited to 64 MiB, so the
# libraries and binaries travel as xz; run.sh unpacks them into /tmp. OpenBLAS, gRPC, OpenSSL,
# Abseil and friends are ~63 MB, ~13 MB as xz. The binaries (~64 MB) share most of their bytes
# (the same CUDA kernel images and static libraries): one solid xz stream whose dictionary holds
# them all (-T1: threads would cut it into blocks that share nothing) takes them to ~4 MB.
libs_carried="$(cd "$stage" && find lib lib-fallback -type f | sort | sed -E 's|^lib/libabsl_.*|lib/libabsl_*|' |
  uniq -c | awk '{printf "%s%s ", $2, ($1 > 1 ? " (" $1 ")" : "")}')"
libs_bytes="$(du -sb "$stage/lib" "$stage/lib-fallback" | awk '{s += $1} END {print s}')"
tar -C "$stage" -cf - lib lib-fallback | xz -T0 -6 >"$stage/lib.tar.xz"
rm -rf "${stage:?}/lib" "${stage:?}/lib-fallback"
bins_bytes="$(du -sb "$stage/bin" "$stage/build" | awk '{s += $1} END {print s}')"
tar -C "$stage" -cf - bin build | xz -T1 -9 --lzma2=preset=9,dict=128MiB >"$stage/bin.tar.xz"
rm -rf "${stage:?}/bin" "${stage:?}/build"

commit="$(git rev-parse --short HEAD)"
[ -z "$(git status --porcelain)" ] || commit="$commit with uncommitted changes"
{
  echo "built:        $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "commit:       $commit"
  echo "nvcc:         $("$nvcc_path" --version | grep -o 'release [0-9.]*' | head -1)"
  echo "cuda archs:   $(grep '^ESTUARY_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2)"
  echo "tests:        $(grep -vc '^#' "$stage/tests.tsv") binaries, $(awk -F'\t' '!/^#/ {s += $4} END {print s}' "$stage/tests.tsv") cases"
  echo "bench:        $([ -n "$bench_exe" ] && echo "bin/$bench_name" || echo none)"
  echo "processes:    ${worker_bins[*]/#/build/}"
  echo "binaries:     bin.tar.xz (bin/, build/)"
  echo "libs carried: $libs_carried"
  echo "from machine: $(tr '\n' ' ' <"$stage/machine-libs.txt")"
  echo "models:       ${models[*]:-none}"
} >"$stage/INFO"

rm -rf "$bundle"
mv "$stage" "$bundle"

bundle_bytes="$(du -sb "$bundle" | cut -f1)"
tree_bytes="$( (git ls-files -z; git ls-files -z --others --exclude-standard) |
  xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')"
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "== $bundle/"
cat "$bundle/INFO"
echo "size:         $(mib "$bundle_bytes") (libraries $(mib "$libs_bytes"), binaries" \
  "$(mib "$bins_bytes") before xz); with the" \
  "working tree ($(mib "$tree_bytes")) $(mib $((bundle_bytes + tree_bytes))) of the 64 MiB that travel"
if [ $((bundle_bytes + tree_bytes)) -gt $((60 * 1048576)) ]; then
  echo "gpu_bundle: WARNING: too close to the 64 MiB limit" >&2
elif [ "$bundle_bytes" -gt $((45 * 1048576)) ]; then
  echo "gpu_bundle: WARNING: over 45 MiB: little room is left for other carried paths" >&2
fi
echo "On the GPU machine, from the repository root (carry .gpu-bundle): bash tests/gpu/run.sh"
