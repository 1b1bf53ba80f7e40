#!/usr/bin/env bash
# Scaling figures of the cluster: `estuary bench-serve` against 1, 2 and 4 decode workers with
# one prefill worker, at a fixed request rate and at saturation (every request at once). For
# each run it prints output tokens/s, TTFT and inter-token latency p50/p99, and the router's own
# CPU time per streamed token (from /proc/<router>/stat, user + system), the figure a paper
# model of a real cluster needs.
#
#   scripts/bench_scaling.sh [MODEL_DIR]     (default: models/stories12L)
#   env: DECODES="1 2 4" RATE=8 REQUESTS=64 INPUT_LEN=32 OUTPUT_LEN=64
#
# Every worker runs on this machine, so they share its cores: the curve flattens once the
# decode workers together use every core. Needs a build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_common.sh "$@"
decodes="${DECODES:-1 2 4}"
rate="${RATE:-8}"
requests="${REQUESTS:-64}"
input_len="${INPUT_LEN:-32}"
output_len="${OUTPUT_LEN:-64}"

printf '%-7s %-10s %12s %10s %10s %10s %10s %8s %18s\n' decode rate "out tok/s" "ttft p50" \
  "ttft p99" "itl p50" "itl p99" errors "router CPU us/tok"
for n in $decodes; do
  ready="$work/ready-$n"
  "$estuary" up --model "$model" --decode "$n" --prefill 1 --port 0 --ready-file "$ready" \
    --log-dir "$work/logs-$n" --kv-cache-bytes 134217728 --shutdown-timeout 5s \
    > "$work/up-$n.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 600); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { echo "estuary up did not start:" >&2; cat "$work/up-$n.log" >&2; exit 1; }
  server="$(head -n1 "$ready")"
  router_pid="$(pgrep -P "$up_pid" -f estuary-router | head -n1)"
  # One warm-up pass, not counted.
  "$estuary" bench-serve --server "$server" --rate 0 --num-requests 4 --input-len "$input_len" \
    --output-len 8 --json > /dev/null
  for r in "$rate" 0; do
    before="$(cpu_ticks "$router_pid")"
    out="$work/bench-$n-$r.json"
    "$estuary" bench-serve --server "$server" --rate "$r" --num-requests "$requests" \
      --input-len "$input_len" --output-len "$output_len" --json > "$out"
    after="$(cpu_ticks "$router_pid")"
    tokens=$((requests * output_len))
    router_us="$(awk -v t=$((after - before)) -v hz="$ticks_per_second" -v n="$tokens" \
      'BEGIN { printf "%.1f", 1e6 * t / hz / n }')"
    label="$r/s"; [ "$r" = 0 ] && label="saturated"
    printf '%-7s %-10s %12.1f %10.1f %10.1f %10.1f %10.1f %8s %18s\n' "$n" "$label" \
      "$(json_field "$out" output_throughput)" "$(json_field "$out" median_ttft_ms)" \
      "$(json_field "$out" p99_ttft_ms)" "$(json_field "$out" median_itl_ms)" \
      "$(json_field "$out" p99_itl_ms)" "$(json_field "$out" failed)" "$router_us"
  done
  kill -TERM "$up_pid"; wait "$up_pid" || true; up_pid=""
done
echo "(latencies in ms; $requests requests of $input_len prompt and $output_len output tokens; $(nproc) cores)"
