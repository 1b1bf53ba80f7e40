#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and the CUDA toolkit: every gpu-labelled test,
# then the decode benchmark (estuary-gpu-bench: full bf16, the river at fixed exit layers and full
# int4 on a synthesized llama-3.2-1b, batch 1, 8 and 32), then a short table.
#
#   bash tests/gpu/run.sh [--tests-only | --bench-only]
#
# Binaries: .gpu-bundle/ when it exists (made by scripts/gpu_bundle.sh on a machine with the
# Debian -dev packages, carried with the shared libraries the GPU machine lacks); otherwise a
# CUDA build configured and built here, which needs gRPC, UCX, Abseil and the rest installed.
# With the bundle the whole run stays under 8 minutes: each test binary gets GPU_TEST_TIMEOUT
# seconds (90), the benchmark GPU_BENCH_TIMEOUT (240), everything GPU_BUDGET (460).
# GPU_BENCH_ARGS replaces the benchmark's arguments (--batches 1,8,32).
# gpu_cluster_test starts the router and worker processes from the bundle's build/ (unpacked into
# /tmp and exported as ESTUARY_BINARY_DIR; without the bundle, from build-cuda/).
# Logs: ${OUT:-/tmp}/gpu-logs/gpu-tests.log (every test binary's whole output, one after another),
# ${OUT:-/tmp}/gpu-bench.txt, ${OUT:-/tmp}/gpu-logs/summary.txt.
# Exit status: 0 when every test passed or skipped and the benchmark, if run, succeeded; 1 when
# something failed; 2 when there is nothing to run.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
root="$(pwd)"

run_tests=1
run_bench=1
case "${1:-}" in
  "") ;;
  --tests-only) run_bench=0 ;;
  --bench-only) run_tests=0 ;;
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: bash tests/gpu/run.sh [--tests-only | --bench-only]" >&2
    exit 2
    ;;
esac

test_timeout="${GPU_TEST_TIMEOUT:-90}"
bench_timeout="${GPU_BENCH_TIMEOUT:-240}"
budget="${GPU_BUDGET:-460}"
bench_args="${GPU_BENCH_ARGS:---batches 1,8,32}"
deadline=$((SECONDS + budget))
out="${OUT:-/tmp}"
log_dir="$out/gpu-logs"
tests_log="$log_dir/gpu-tests.log"
bench_log="$out/gpu-bench.txt"
summary_file="$log_dir/summary.txt"
mkdir -p "$log_dir"
: >"$tests_log"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/estuary-gpu.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

# ---- the GPU --------------------------------------------------------------------------------
echo "== GPU"
gpu_visible=0
if command -v nvidia-smi >/dev/null 2>&1; then
  if nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,temperature.gpu \
    --format=csv 2>&1; then
    gpu_visible=1
    nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1
  fi
else
  echo "nvidia-smi not found"
fi

# ---- the binaries ---------------------------------------------------------------------------
bundle="$root/.gpu-bundle"
if [ -f "$bundle/tests.tsv" ]; then
  echo "== binaries: .gpu-bundle/"
  grep -E '^(built|commit|nvcc|tests|bench|processes):' "$bundle/INFO" 2>/dev/null | sed 's/^/  /'
  manifest="$bundle/tests.tsv"
  unpack() { # archive in the bundle -> its contents under $scratch
    [ -f "$bundle/$1" ] || return 0
    tar -C "$scratch" -xJf "$bundle/$1" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/$1" "$scratch" || {
      echo "run.sh: cannot unpack .gpu-bundle/$1" >&2
      exit 2
    }
  }
  unpack lib.tar.xz
  # bin/ and build/ come packed (bin.tar.xz); an older bundle has bin/ unpacked.
  exe_base="$bundle"
  if [ -f "$bundle/bin.tar.xz" ]; then
    unpack bin.tar.xz
    exe_base="$scratch"
  fi
  bench_exe="$exe_base/bin/estuary-gpu-bench"
  mapfile -t machine_libs < <(cat "$bundle/machine-libs.txt" 2>/dev/null)
  models_dir="$bundle/models"
  # The processes gpu_cluster_test starts (BinaryPath, tests/testing/subprocess.cc): the bundle's
  # build/ stands in for the build folder, whose absolute path the binaries were compiled with.
  worker_bins=()
  if [ -d "$exe_base/build" ]; then
    export ESTUARY_BINARY_DIR="$exe_base/build"
    mapfile -t worker_bins < <(cd "$exe_base" && find build -type f -perm -u+x | sort)
  fi
  # UCX loads its transport modules (libuct_ib, libuct_cma...) from lib/ucx/ beside libucs and
  # from UCX_MODULE_DIR (default: the build machine's /usr/lib/x86_64-linux-gnu/ucx). The bundle
  # carries none (tcp, which the workers use, is built into libuct): point UCX at the bundle's
  # empty folder so that it never loads a module of another UCX version from this machine.
  mkdir -p "$scratch/lib/ucx"
  export UCX_MODULE_DIR="$scratch/lib/ucx"
else
  echo "== binaries: no .gpu-bundle/, configuring the CUDA build here (build-cuda/)"
  nvcc_path="$(command -v nvcc || true)"
  [ -n "$nvcc_path" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc_path=/usr/local/cuda/bin/nvcc
  if [ -z "$nvcc_path" ] || ! command -v cmake >/dev/null || ! command -v ninja >/dev/null ||
    ! cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DESTUARY_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc_path" -DESTUARY_BENCHMARKS=OFF >"$scratch/configure.log" 2>&1
  then
    grep -m 5 -E 'Could not find|CMake Error|not found' "$scratch/configure.log" 2>/dev/null | sed 's/^/  /'
    echo "run.sh: cannot build here: this machine lacks nvcc, cmake or ninja, or the Debian -dev"
    echo "  packages (gRPC, Protobuf, UCX, Abseil, GoogleTest, OpenBLAS, Highway...). On the"
    echo "  development machine run 'bash scripts/gpu_bundle.sh' and bring .gpu-bundle/ along"
    echo "  (device tool: carry [\".gpu-bundle\"]), then run this script again."
    exit 2
  fi
  cmake --build build-cuda --parallel "$(nproc)" --target gpu_tests || exit 2
  (cd build-cuda && ctest --show-only=json-v1 -L gpu) >"$scratch/ctest.json" || exit 2
  manifest="$scratch/tests.tsv"
  python3 tests/gpu/manifest.py tests --ctest-json "$scratch/ctest.json" --source-dir . \
    >"$manifest" || exit 2
  exe_base="$root"
  bench_exe="$(find build-cuda -type f -name estuary-gpu-bench -perm -u+x -print -quit)"
  bench_exe="${bench_exe:+$root/$bench_exe}"
  machine_libs=()
  models_dir=""
  worker_bins=()
  for worker in router/estuary-router prefill/estuary-prefill decode/estuary-decode; do
    [ ! -x "build-cuda/$worker" ] || worker_bins+=("@root/build-cuda/$worker")
  done
fi

# Tests run from the repository root and read models/ (GoldenModelDir honours ESTUARY_MODELS_DIR,
# the bundle's copy). Older layouts read ../shared/models: where it is not beside the checkout,
# they run from a copy of the root made of links, with the bundle's models beside it.
run_root="$root"
if [ -n "$models_dir" ] && [ -n "$(ls -A "$models_dir" 2>/dev/null)" ]; then
  export ESTUARY_MODELS_DIR="$models_dir"
  if [ ! -d "$root/../shared/models" ]; then
    run_root="$scratch/root"
    mkdir -p "$run_root" "$scratch/shared"
    ln -s "$models_dir" "$scratch/shared/models"
    for entry in "$root"/* "$root"/.[!.]*; do
      [ -e "$entry" ] && ln -s "$entry" "$run_root/"
    done
  fi
fi

# ---- shared libraries -----------------------------------------------------------------------
# The bundle's own first, then the machine's cuBLAS / NCCL (CUDA toolkit, else the pip wheels
# that PyTorch brings), then whatever LD_LIBRARY_PATH already held.
lib_path=()
[ ! -d "$scratch/lib" ] || lib_path+=("$scratch/lib")
search_dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
  /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib)
py_nvidia="$(timeout 30 python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)"
for dir in $py_nvidia /opt/torch/.venv/lib/python3*/site-packages/nvidia \
  /usr/local/lib/python3*/dist-packages/nvidia /usr/lib/python3/dist-packages/nvidia; do
  search_dirs+=("$dir"/*/lib)
done
find_lib() { # soname -> the first search dir that holds it
  local dir
  for dir in "${search_dirs[@]}"; do
    if [ -e "$dir/$1" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}
add_lib_dir() {
  local dir
  for dir in "${lib_path[@]}"; do [ "$dir" != "$1" ] || return 0; done
  lib_path+=("$1")
}
echo "== libraries"
missing_libs=0
for soname in "${machine_libs[@]}"; do
  if dir="$(find_lib "$soname")"; then
    echo "  $soname: $dir"
    add_lib_dir "$dir"
  elif ldconfig -p 2>/dev/null | grep -q " $soname "; then
    echo "  $soname: system (ldconfig)"
  else
    echo "  $soname: NOT FOUND (looked in the CUDA toolkit and python3's nvidia/*/lib)"
    missing_libs=1
  fi
done
if ! ldconfig -p 2>/dev/null | grep -q ' libcuda\.so\.1 '; then
  found=""
  ld_dirs="${LD_LIBRARY_PATH:-}"
  for dir in ${ld_dirs//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
    /usr/lib/x86_64-linux-gnu /usr/lib64; do
    if [ -e "$dir/libcuda.so.1" ]; then
      found="$dir"
      break
    fi
  done
  if [ -n "$found" ]; then
    echo "  libcuda.so.1 (driver): $found"
    add_lib_dir "$found"
  else
    echo "  libcuda.so.1 (driver): not found: every device test will skip"
  fi
fi
LD_LIBRARY_PATH="$(IFS=:; echo "${lib_path[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

mapfile -t binaries < <(awk -F'\t' '!/^#/ {print $2}' "$manifest" | sort -u)
[ -z "$bench_exe" ] || [ ! -e "$bench_exe" ] || binaries+=("$bench_exe")
binaries+=("${worker_bins[@]}")
resolve_exe() { # manifest path -> absolute path
  case "$1" in
    @root/*) echo "$root/${1#@root/}" ;;
    /*) echo "$1" ;;
    *) echo "$exe_base/$1" ;;
  esac
}
# libstdc++ / libgcc_s come from the machine unless it lacks them or they are older than the
# build's (the bundle's lib-fallback/ then).
if [ -d "$scratch/lib-fallback" ] && [ "${#binaries[@]}" -gt 0 ] &&
  ldd "$(resolve_exe "${binaries[0]}")" 2>&1 | grep -qE 'lib(stdc\+\+|gcc_s)[^ ]* => not found|GLIBCXX|CXXABI|GCC_[0-9]'; then
  echo "  libstdc++ / libgcc_s: the machine's are missing or too old, using the bundle's"
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$scratch/lib-fallback"
fi
for exe in "${binaries[@]}"; do
  exe="$(resolve_exe "$exe")"
  unresolved="$(ldd "$exe" 2>&1 | grep -E 'not found' | sed -E 's/^[[:space:]]*//' | tr '\n' ' ')"
  if [ -n "$unresolved" ]; then
    echo "  $(basename "$exe"): $unresolved"
    missing_libs=1
  fi
done
[ "$missing_libs" -eq 0 ] && echo "  every binary's libraries resolve"

# ---- tests ----------------------------------------------------------------------------------
rows=()      # name, listed, passed, failed, skipped, seconds, status
any_failed=0
total_listed=0 total_passed=0 total_failed=0 total_skipped=0
gtest_count() { # label (PASSED, SKIPPED, FAILED) file -> the summary's count, or 0
  local n
  n="$(sed -n -E "s/^\[  $1 *\] ([0-9]+) tests?[,.].*/\1/p" "$2" | tail -1)"
  echo "${n:-0}"
}
if [ "$run_tests" -eq 1 ]; then
  test_deadline=$deadline
  [ "$run_bench" -eq 0 ] || test_deadline=$((deadline - bench_timeout - 10))
  count="$(grep -vc '^#' "$manifest")"
  echo "== tests: $count binaries (log: $tests_log)"
  index=0
  while IFS=$'\t' read -r -a fields; do
    if [ "${#fields[@]}" -lt 7 ] || [ "${fields[0]:0:1}" = "#" ]; then continue; fi
    index=$((index + 1))
    name="${fields[0]}" kind="${fields[2]}" listed="${fields[3]}" own_timeout="${fields[4]}"
    exe="$(resolve_exe "${fields[1]}")"
    workdir="${fields[5]/#@root/$run_root}"
    envs=()
    if [ "${fields[6]}" != "-" ]; then
      IFS=';' read -r -a envs <<<"${fields[6]//@root/$run_root}"
    fi
    args=()
    for arg in "${fields[@]:7}"; do args+=("${arg//@root/$run_root}"); done
    limit=$test_timeout
    [ "$own_timeout" -le 0 ] || [ "$own_timeout" -ge "$limit" ] || limit=$own_timeout
    left=$((test_deadline - SECONDS))
    [ "$left" -ge "$limit" ] || limit=$left
    total_listed=$((total_listed + listed))
    if [ "$left" -lt 5 ]; then
      rows+=("$name|$listed|0|0|0|0|NOT RUN (time budget)")
      any_failed=1
      echo "  [$index/$count] $name: not run, the time budget is spent"
      continue
    fi
    output="$scratch/test.out"
    started=$SECONDS
    (cd "$workdir" && env "${envs[@]}" timeout -k 5 "$limit" "$exe" "${args[@]}") >"$output" 2>&1
    rc=$?
    seconds=$((SECONDS - started))
    {
      echo "===== $name: $exe ${args[*]} (cwd $workdir, exit $rc, ${seconds}s)"
      cat "$output"
      echo
    } >>"$tests_log"
    if [ "$kind" = gtest ]; then
      passed="$(gtest_count PASSED "$output")"
      failed="$(gtest_count FAILED "$output")"
      skipped="$(gtest_count SKIPPED "$output")"
    else
      passed=$((rc == 0)) failed=$((rc != 0)) skipped=0
    fi
    ran=$((passed + failed + skipped))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      status="TIMEOUT after ${limit}s"
    elif grep -q 'error while loading shared libraries' "$output"; then
      status="CANNOT START (libraries)"
    elif [ "$failed" -gt 0 ]; then
      status="FAIL"
      [ "$kind" = gtest ] || status="FAIL (exit $rc)"
    elif [ "$rc" -ne 0 ]; then
      status="CRASH (exit $rc)"
    elif [ "$ran" -ne "$listed" ]; then
      status="ok (ran $ran, ctest listed $listed)"
    else
      status="ok"
    fi
    case "$status" in ok*) ;; *) any_failed=1 ;; esac
    rows+=("$name|$listed|$passed|$failed|$skipped|$seconds|$status")
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    total_skipped=$((total_skipped + skipped))
    echo "  [$index/$count] $name: $passed passed, $failed failed, $skipped skipped (${seconds}s) $status"
  done <"$manifest"
fi

# ---- benchmark ------------------------------------------------------------------------------
bench_status="not run (--tests-only)"
if [ "$run_bench" -eq 1 ]; then
  echo "== benchmark: estuary-gpu-bench $bench_args (log: $bench_log)"
  left=$((deadline - SECONDS))
  limit=$bench_timeout
  [ "$left" -ge "$limit" ] || limit=$left
  if [ -z "$bench_exe" ] || [ ! -x "$bench_exe" ]; then
    bench_status="MISSING (estuary-gpu-bench not built or not in the bundle)"
    echo "$bench_status" | tee "$bench_log"
    any_failed=1
  elif [ "$left" -lt 10 ]; then
    bench_status="NOT RUN (time budget)"
    any_failed=1
  else
    started=$SECONDS
    # shellcheck disable=SC2086  # bench_args is a word list on purpose
    (cd "$run_root" && timeout -k 5 "$limit" "$bench_exe" $bench_args) 2>&1 | tee "$bench_log"
    rc=${PIPESTATUS[0]}
    seconds=$((SECONDS - started))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      bench_status="TIMEOUT after ${limit}s"
      any_failed=1
    elif [ "$rc" -ne 0 ]; then
      bench_status="FAIL (exit $rc, ${seconds}s)"
      any_failed=1
    else
      bench_status="ok (${seconds}s)"
    fi
  fi
fi

# ---- summary --------------------------------------------------------------------------------
{
  echo "== summary"
  if [ "$run_tests" -eq 1 ]; then
    printf '%-30s %6s %6s %6s %7s %5s  %s\n' binary listed passed failed skipped secs status
    for row in "${rows[@]}"; do
      IFS='|' read -r name listed passed failed skipped seconds status <<<"$row"
      printf '%-30s %6s %6s %6s %7s %5s  %s\n' "$name" "$listed" "$passed" "$failed" "$skipped" \
        "$seconds" "$status"
    done
    printf '%-30s %6s %6s %6s %7s\n' all "$total_listed" "$total_passed" "$total_failed" \
      "$total_skipped"
    if [ "$gpu_visible" -eq 1 ] && [ "$total_skipped" -gt 0 ] &&
      [ "$total_skipped" -eq $((total_passed + total_skipped)) ]; then
      echo "WARNING: nvidia-smi sees a GPU but every test that ran skipped (libcuda? see the log)"
    fi
  fi
  echo "benchmark: $bench_status"
  echo "total: $((SECONDS - deadline + budget))s of the ${budget}s budget; logs in $log_dir/" \
    "and $bench_log"
  if [ "$any_failed" -eq 0 ]; then echo "GPU checks: PASS"; else echo "GPU checks: FAIL"; fi
} | tee "$summary_file"
exit "$any_failed"
