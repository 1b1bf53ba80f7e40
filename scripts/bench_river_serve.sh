#!/usr/bin/env bash
# The exit river through a real cluster: `estuary bench-serve` against one prefill and one
# decode worker (`estuary up`), the decode worker at full depth, then with the river under each
# setting of RIVER_RUNS, at a fixed request rate. Prints per run output tokens/s, inter-token
# latency p50/p99, the mean backbone layers per generated token (the decode worker's
# estuary:backbone_layers_per_token histogram) and the ratio to full depth (issue 18's target:
# river >= 1.3x output tokens/s).
#
#   scripts/bench_river_serve.sh [MODEL_DIR]   (default: models/stories12L; the 1B shape:
#                                               estuary synth --preset llama-1b-v512 --out DIR)
#   env: RATE=2 (0: every request at once) REQUESTS=16 INPUT_LEN=32 OUTPUT_LEN=32
#        RIVER_RUNS="--max-backbone-layers 4"   river settings separated by ';', e.g.
#          "--exit-threshold 0.8 --exit-rule batch_min;--exit-threshold 0.8 --exit-rule all_passed"
#
# Every run uses the same prompts (bench-serve's fixed seed) and greedy decoding (its default).
# All processes share this machine's cores, so the figures are the engine's under contention
# with prefill.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_common.sh "$@"
command -v curl > /dev/null || { echo "needs curl (apt-get install curl)" >&2; exit 1; }
rate="${RATE:-2}"
requests="${REQUESTS:-16}"
input_len="${INPUT_LEN:-32}"
output_len="${OUTPUT_LEN:-32}"
IFS=';' read -r -a river_runs <<< "${RIVER_RUNS:---max-backbone-layers 4}"

# One cluster, one bench-serve run, extra decode flags in "$@"; prints
# "tok/s itl_p50 itl_p99 failed mean_backbone_layers".
run() {
  local name="$1"; shift
  local ready="$work/ready-$name" port=$((20000 + RANDOM % 20000))
  "$estuary" up --model "$model" --decode 1 --prefill 1 --port 0 --ready-file "$ready" \
    --metrics-port "$port" --log-dir "$work/logs-$name" --kv-cache-bytes 268435456 \
    --shutdown-timeout 5s "$@" > "$work/up-$name.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 1200); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { echo "estuary up did not start:" >&2; cat "$work/up-$name.log" >&2; exit 1; }
  local server out="$work/bench-$name.json"
  server="$(head -n1 "$ready")"
  "$estuary" bench-serve --server "$server" --rate 0 --num-requests 2 --input-len "$input_len" \
    --output-len 4 --json > /dev/null  # warm-up, not counted
  local metrics="$work/metrics-$name-before"
  curl -sf "http://127.0.0.1:$((port + 1))/metrics" > "$metrics"  # the decode worker: port + 1
  "$estuary" bench-serve --server "$server" --rate "$rate" --num-requests "$requests" \
    --input-len "$input_len" --output-len "$output_len" --json > "$out"
  curl -sf "http://127.0.0.1:$((port + 1))/metrics" > "$metrics-after"
  kill -TERM "$up_pid"; wait "$up_pid" || true; up_pid=""
  local layers
  layers="$(awk '/^estuary:backbone_layers_per_token_(sum|count)/ {
      name = $1; sub(/\{.*/, "", name); v[FILENAME, name] = $2 }
    END { s = v[ARGV[2], "estuary:backbone_layers_per_token_sum"] - v[ARGV[1], "estuary:backbone_layers_per_token_sum"];
          n = v[ARGV[2], "estuary:backbone_layers_per_token_count"] - v[ARGV[1], "estuary:backbone_layers_per_token_count"];
          printf "%.2f", (n > 0 ? s / n : -1) }' "$metrics" "$metrics-after")"
  echo "$(json_field "$out" output_throughput) $(json_field "$out" median_itl_ms)" \
    "$(json_field "$out" p99_itl_ms) $(json_field "$out" failed) $layers"
}

row() {  # label tok/s p50 p99 failed layers baseline_tok/s
  printf '%-58s %10.2f %8.2fx %10.1f %10.1f %8s %9s\n' "$1" "$2" "$(awk -v a="$2" -v b="$7" \
    'BEGIN { print a / b }')" "$3" "$4" "$5" "$6"
}

printf '%-58s %10s %9s %10s %10s %8s %9s\n' run "out tok/s" "vs full" "itl p50 ms" "itl p99 ms" \
  failed layers
read -r full_tps full_p50 full_p99 full_failed full_layers <<< "$(run full)"
row "full depth" "$full_tps" "$full_p50" "$full_p99" "$full_failed" "$full_layers" "$full_tps"
i=0
for flags in "${river_runs[@]}"; do
  read -r -a argv <<< "$flags"
  read -r tps p50 p99 failed layers <<< "$(run "river-$i" --river "${argv[@]}")"
  row "river $flags" "$tps" "$p50" "$p99" "$failed" "$layers" "$full_tps"
  i=$((i + 1))
done
echo "($requests requests at rate $rate/s (0: all at once), $input_len prompt and $output_len" \
  "output tokens, $(basename "$model"), $(nproc) cores; layers: mean backbone layers per token)"
