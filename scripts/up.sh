#!/usr/bin/env bash
# Builds Estuary and runs the main job on the default model: a local disaggregated cluster
# (`estuary up --river`: router, one prefill worker, one decode worker running the exit river,
# KV over UCX on loopback), then one request through it, whose story is printed as it streams,
# then its figures (time to first token, decode tokens/s, mean backbone layers, exit rate). The
# cluster then keeps serving on the printed address until Ctrl-C; with ESTUARY_UP_ONESHOT=1 it
# stops after the story.
#   ESTUARY_MODEL (default: the shipped stories12L), ESTUARY_PROMPT, ESTUARY_MAX_TOKENS,
#   ESTUARY_PORT (default 50051); extra arguments go to `estuary up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh

ready="$(mktemp -u /tmp/estuary-up-ready.XXXXXX)"
./build/cli/estuary up --port "${ESTUARY_PORT:-50051}" --river --ready-file "$ready" "$@" &
up_pid=$!
trap 'kill -TERM "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; rm -f "$ready"' EXIT
for _ in $(seq 1 600); do
  [ -s "$ready" ] && break
  kill -0 "$up_pid" 2>/dev/null || { echo "estuary up failed" >&2; exit 1; }
  sleep 0.1
done
[ -s "$ready" ] || { echo "the cluster did not come up in 60 s" >&2; exit 1; }
server="$(cat "$ready")"

./build/cli/estuary client --server "$server" --prompt "${ESTUARY_PROMPT:-Once upon a time}" \
  --max-tokens "${ESTUARY_MAX_TOKENS:-200}" --temperature 0

if [ "${ESTUARY_UP_ONESHOT:-0}" = 1 ]; then exit 0; fi
echo "cluster serving on $server (estuary client --server $server --prompt ...); Ctrl-C stops it"
wait "$up_pid"
