#!/usr/bin/env bash
# Two builds' OpenAI HTTP door side by side: one `estuary up` cluster per build (1 prefill +
# 1 decode worker, the router with --http-port), both running at once, and `estuary bench-serve`
# (this checkout's) alternating between them run by run, over HTTP and then gRPC, so that a
# shared machine's drift hits both builds alike. Prints per run the output tokens/s, TPOT and ITL
# p50 (ms) and the router's CPU time per streamed token (user + system from /proc/<router>/stat),
# then the medians. README's "HTTP vs gRPC" before/after figures come from here.
#
#   scripts/bench_http_builds.sh OLD_ESTUARY NEW_ESTUARY [MODEL_DIR]
#     e.g. scripts/bench_http_builds.sh ../old/build/cli/estuary build/cli/estuary
#   env: RUNS=6 RATE=16 CONCURRENCY=8 REQUESTS=64 INPUT_LEN=64 OUTPUT_LEN=128 HTTP_PORT=18300
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0" >&2; exit 2; }
declare -A bin=([old]="$1" [new]="$2")
shift 2
source scripts/bench_common.sh "$@"
runs="${RUNS:-6}"
rate="${RATE:-16}"
concurrency="${CONCURRENCY:-8}"
requests="${REQUESTS:-64}"
input_len="${INPUT_LEN:-64}"
output_len="${OUTPUT_LEN:-128}"
port="${HTTP_PORT:-18300}"
declare -A up router http grpc
stop_all() {
  for b in old new; do
    [ -n "${up[$b]:-}" ] && kill -TERM "${up[$b]}" 2>/dev/null && wait "${up[$b]}" 2>/dev/null
  done
  bench_cleanup
}
trap stop_all EXIT
for b in old new; do
  [ -x "${bin[$b]}" ] || { echo "no estuary binary ${bin[$b]}" >&2; exit 1; }
  "${bin[$b]}" up --model "$model" --prefill 1 --decode 1 --port 0 --http-port "$port" \
    --ready-file "$work/$b.ready" --log-dir "$work/$b-logs" --shutdown-timeout 5s \
    > "$work/$b.log" 2>&1 &
  up[$b]=$!
  http[$b]="http://127.0.0.1:$port/v1/completions"
  port=$((port + 1))
done
for b in old new; do
  for _ in $(seq 600); do [ -s "$work/$b.ready" ] && break; sleep 0.1; done
  [ -s "$work/$b.ready" ] || { echo "estuary up ($b) did not start:" >&2; cat "$work/$b.log" >&2; exit 1; }
  grpc[$b]="--server $(head -n1 "$work/$b.ready")"
  router[$b]="$(pgrep -P "${up[$b]}" -f estuary-router | head -n1)"
  http[$b]="--endpoint ${http[$b]}"
done
common=(--rate "$rate" --max-concurrency "$concurrency" --num-requests "$requests"
        --input-len "$input_len" --output-len "$output_len" --json)
for b in old new; do  # warm-up, not counted
  for target in "${http[$b]}" "${grpc[$b]}"; do
    # shellcheck disable=SC2086
    "$estuary" bench-serve $target --rate 0 --num-requests 4 --input-len "$input_len" \
      --output-len 8 --json > /dev/null
  done
done
printf '%-4s %-4s %-5s %10s %9s %9s %18s\n' run build proto "out tok/s" "tpot p50" "itl p50" \
  "router CPU us/tok" | tee "$work/table"
for r in $(seq "$runs"); do
  for b in old new; do
    for proto in http grpc; do
      target="${http[$b]}"
      [ "$proto" = grpc ] && target="${grpc[$b]}"
      before="$(cpu_ticks "${router[$b]}")"
      # shellcheck disable=SC2086
      "$estuary" bench-serve $target "${common[@]}" > "$work/run.json"
      after="$(cpu_ticks "${router[$b]}")"
      printf '%-4s %-4s %-5s %10.1f %9.3f %9.3f %18.1f\n' "$r" "$b" "$proto" \
        "$(json_field "$work/run.json" output_throughput)" \
        "$(json_field "$work/run.json" median_tpot_ms)" \
        "$(json_field "$work/run.json" median_itl_ms)" \
        "$(awk -v t=$((after - before)) -v hz="$ticks_per_second" \
             -v n=$((requests * output_len)) 'BEGIN { print 1e6 * t / hz / n }')" | tee -a "$work/table"
    done
  done
done
echo "medians over $runs runs (min-max):"
for b in old new; do
  for proto in http grpc; do
    awk -v b="$b" -v p="$proto" '$2 == b && $3 == p { print $7 }' "$work/table" | sort -g |
      awk -v b="$b" -v p="$proto" '{ v[NR] = $1 } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%-4s %-5s router CPU %.1f us/token (%.1f-%.1f)\n", b, p, m, v[1], v[NR] }'
  done
done
echo "($requests requests of $input_len prompt and $output_len output tokens at $rate req/s," \
  "at most $concurrency in flight; $(nproc) cores)"
