#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and runs each for
# FUZZ_SECONDS (default 60) on its seed corpus. Fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
cmake -S . -B build-fuzz -G Ninja -DESTUARY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz --parallel "$(nproc)"
for target in safetensors_header_fuzzer tokenizer_json_fuzzer chat_template_fuzzer; do
  corpus="fuzz/corpus/${target%_fuzzer}"
  work="build-fuzz/corpus-${target}"
  mkdir -p "$work"
  seeds=("$corpus")
  # The chat template fuzzer also starts from the published model templates.
  if [ "$target" = chat_template_fuzzer ]; then seeds+=(tests/chat/templates); fi
  echo "fuzzing $target for ${seconds}s"
  ./build-fuzz/fuzz/"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$work" "${seeds[@]}" 2>&1 | tail -n 12
done
