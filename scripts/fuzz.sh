#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ (just the targets and the
# decoder libraries they link: fuzz/CMakeLists.txt) and runs each for FUZZ_SECONDS (default 60)
# on its seed corpus, `nproc` targets at a time. Fails on any finding (crash, sanitizer report,
# leak, timeout, memory limit) and names the input that caused it (build-fuzz/artifacts/).
# FUZZ_TARGETS="a_fuzzer b_fuzzer" runs only those. A finding's input replays with
#   ./build-fuzz/fuzz/TARGET build-fuzz/artifacts/TARGET/crash-...
# and belongs in fuzz/corpus/<target without _fuzzer>/ as a regression seed once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
all_targets=(safetensors_header_fuzzer tokenizer_json_fuzzer chat_template_fuzzer
             hf_config_fuzzer llama2c_files_fuzzer kv_control_fuzzer nccl_frame_fuzzer
             request_proto_fuzzer)
read -r -a targets <<< "${FUZZ_TARGETS:-${all_targets[*]}}"
cmake -S . -B build-fuzz -G Ninja -DESTUARY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target "${targets[@]}"

# One target: its seeds (and, for the chat template fuzzer, the published model templates), a
# working corpus it grows in build-fuzz/, its findings under build-fuzz/artifacts/TARGET/.
run_target() {
  local target="$1"
  local corpus="fuzz/corpus/${target%_fuzzer}"
  local work="build-fuzz/corpus-${target}"
  local artifacts="build-fuzz/artifacts/${target}"
  mkdir -p "$work" "$artifacts"
  local seeds=("$corpus")
  if [ "$target" = chat_template_fuzzer ]; then seeds+=(tests/chat/templates); fi
  local status=0
  ./build-fuzz/fuzz/"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$work" "${seeds[@]}" \
    > "build-fuzz/logs/${target}.log" 2>&1 || status=$?
  echo "$status" > "build-fuzz/logs/${target}.status"
}

mkdir -p build-fuzz/logs
rm -f build-fuzz/logs/*.status
parallel="$(nproc)"
echo "fuzzing ${#targets[@]} targets for ${seconds}s each, ${parallel} at a time"
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  run_target "$target" &
done
wait

failed=()
for target in "${targets[@]}"; do
  status="$(cat "build-fuzz/logs/${target}.status" 2>/dev/null || echo missing)"
  runs="$(grep -o 'stat::number_of_executed_units: [0-9]*' "build-fuzz/logs/${target}.log" \
    | awk '{print $2}' | tail -n 1)"
  if [ "$status" = 0 ]; then
    echo "fuzz $target: ok, ${runs:-?} inputs in ${seconds}s"
  else
    failed+=("$target")
    echo "fuzz $target: FAILED (status $status); the end of build-fuzz/logs/${target}.log:"
    tail -n 40 "build-fuzz/logs/${target}.log"
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz findings in: ${failed[*]} (inputs under build-fuzz/artifacts/)"
  exit 1
fi
