#!/usr/bin/env bash
# The exit river through a real cluster: `estuary bench-serve` against one prefill and one
# decode worker (`estuary up`), the decode worker with the river off, then on, at a fixed
# request rate. Prints output tokens/s and inter-token latency p50/p99 of each run and the
# ratios river / full depth (issue 18's target: river on >= 1.3x output tokens/s).
#
#   scripts/bench_river_serve.sh [MODEL_DIR]   (default: models/stories12L; the 1B shape:
#                                               estuary synth --preset llama-1b-v512 --out DIR)
#   env: RATE=2 REQUESTS=16 INPUT_LEN=32 OUTPUT_LEN=32
#        RIVER_FLAGS="--max-backbone-layers 4"   (how the river exits; e.g. "--exit-threshold 0.8")
#
# Both runs use the same prompts (bench-serve's fixed seed) and greedy decoding (its default). Every process
# shares this machine's cores, so the figures are the engine's under contention with prefill.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_common.sh "$@"
rate="${RATE:-2}"
requests="${REQUESTS:-16}"
input_len="${INPUT_LEN:-32}"
output_len="${OUTPUT_LEN:-32}"
read -r -a river_flags <<< "${RIVER_FLAGS:---max-backbone-layers 4}"

# One cluster, one bench-serve run; prints "tok/s itl_p50 itl_p99 failed".
run() {
  local name="$1"; shift
  local ready="$work/ready-$name"
  "$estuary" up --model "$model" --decode 1 --prefill 1 --port 0 --ready-file "$ready" \
    --log-dir "$work/logs-$name" --kv-cache-bytes 268435456 --shutdown-timeout 5s "$@" \
    > "$work/up-$name.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 1200); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { echo "estuary up did not start:" >&2; cat "$work/up-$name.log" >&2; exit 1; }
  local server out="$work/bench-$name.json"
  server="$(head -n1 "$ready")"
  "$estuary" bench-serve --server "$server" --rate 0 --num-requests 2 --input-len "$input_len" \
    --output-len 4 --json > /dev/null  # warm-up, not counted
  "$estuary" bench-serve --server "$server" --rate "$rate" --num-requests "$requests" \
    --input-len "$input_len" --output-len "$output_len" --json > "$out"
  kill -TERM "$up_pid"; wait "$up_pid" || true; up_pid=""
  echo "$(json_field "$out" output_throughput) $(json_field "$out" median_itl_ms)" \
    "$(json_field "$out" p99_itl_ms) $(json_field "$out" failed)"
}

read -r full_tps full_p50 full_p99 full_failed <<< "$(run full)"
read -r river_tps river_p50 river_p99 river_failed <<< "$(run river --river "${river_flags[@]}")"
printf '%-28s %12s %12s %12s %8s\n' run "out tok/s" "itl p50 ms" "itl p99 ms" failed
printf '%-28s %12.2f %12.1f %12.1f %8s\n' "full depth" "$full_tps" "$full_p50" "$full_p99" \
  "$full_failed"
printf '%-28s %12.2f %12.1f %12.1f %8s\n' "river (${river_flags[*]})" "$river_tps" "$river_p50" \
  "$river_p99" "$river_failed"
awk -v a="$river_tps" -v b="$full_tps" -v p="$full_p50" -v q="$river_p50" \
  'BEGIN { printf "river / full: %.2fx output tokens/s, %.2fx inter-token p50 (target >= 1.3x tokens/s)\n", a / b, p / q }'
echo "($requests requests at $rate/s, $input_len prompt and $output_len output tokens, $(basename "$model"), $(nproc) cores)"
