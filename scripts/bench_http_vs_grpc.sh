#!/usr/bin/env bash
# The router's cost of OpenAI HTTP over gRPC: `estuary bench-serve` against one `estuary up`
# cluster (1 prefill + 1 decode worker, the router with --http-port) over both protocols, at the
# same rate and concurrency and with the same prompts (same --seed), alternating the two so that
# drift on a shared machine hits both alike. Prints, per protocol, the median over REPEATS runs
# of output tokens/s, TTFT and ITL p50/p99 (ms), and the router's own CPU time per streamed token
# (user + system from /proc/<router>/stat): the per-chunk overhead of HTTP is the difference.
# ITL is per streamed chunk, as in vLLM; the HTTP door may put several tokens in one SSE event
# when its writer falls behind, so compare TPOT (per token) and the router CPU per token too.
#
#   scripts/bench_http_vs_grpc.sh [MODEL_DIR]     (default: models/stories12L)
#   env: RATE=16 CONCURRENCY=8 REQUESTS=64 INPUT_LEN=64 OUTPUT_LEN=128 REPEATS=3
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench_common.sh "$@"
rate="${RATE:-16}"
concurrency="${CONCURRENCY:-8}"
requests="${REQUESTS:-64}"
input_len="${INPUT_LEN:-64}"
output_len="${OUTPUT_LEN:-128}"
repeats="${REPEATS:-3}"
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

http_port="${HTTP_PORT:-18080}"
ready="$work/ready"
"$estuary" up --model "$model" --prefill 1 --decode 1 --port 0 --http-port "$http_port" \
  --ready-file "$ready" --log-dir "$work/logs" --shutdown-timeout 5s > "$work/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 600); do [ -s "$ready" ] && break; sleep 0.1; done
[ -s "$ready" ] || { echo "estuary up did not start:" >&2; cat "$work/up.log" >&2; exit 1; }
server="$(head -n1 "$ready")"
router_pid="$(pgrep -P "$up_pid" -f estuary-router | head -n1)"
declare -A target=([grpc]="--server $server"
                   [openai]="--endpoint http://127.0.0.1:$http_port/v1/completions")
common=(--rate "$rate" --max-concurrency "$concurrency" --num-requests "$requests"
        --input-len "$input_len" --output-len "$output_len" --json)
for backend in grpc openai; do  # warm-up, not counted
  # shellcheck disable=SC2086
  "$estuary" bench-serve ${target[$backend]} --rate 0 --num-requests 4 --input-len "$input_len" \
    --output-len 8 --json > /dev/null
done
for r in $(seq "$repeats"); do
  for backend in grpc openai; do
    before="$(cpu_ticks "$router_pid")"
    # shellcheck disable=SC2086
    "$estuary" bench-serve ${target[$backend]} "${common[@]}" > "$work/$backend-$r.json"
    after="$(cpu_ticks "$router_pid")"
    awk -v t=$((after - before)) -v hz="$ticks_per_second" -v n=$((requests * output_len)) \
      'BEGIN { printf "%.1f\n", 1e6 * t / hz / n }' > "$work/$backend-$r.cpu"
  done
done
printf '%-7s %10s %9s %9s %9s %9s %9s %9s %7s %17s\n' backend "out tok/s" "ttft p50" "ttft p99" \
  "tpot p50" "itl p50" "itl p99" "e2el p50" failed "router CPU us/tok"
for backend in grpc openai; do
  col() { for r in $(seq "$repeats"); do json_field "$work/$backend-$r.json" "$1"; done | median; }
  cpu="$(cat "$work/$backend"-*.cpu | median)"
  printf '%-7s %10.1f %9.2f %9.2f %9.3f %9.3f %9.3f %9.1f %7s %17s\n' "$backend" \
    "$(col output_throughput)" "$(col median_ttft_ms)" "$(col p99_ttft_ms)" \
    "$(col median_tpot_ms)" "$(col median_itl_ms)" "$(col p99_itl_ms)" "$(col median_e2el_ms)" \
    "$(col failed)" "$cpu"
done
echo "(median of $repeats runs; $requests requests of $input_len prompt and $output_len output" \
  "tokens at $rate req/s, at most $concurrency in flight; $(nproc) cores; latencies in ms)"
