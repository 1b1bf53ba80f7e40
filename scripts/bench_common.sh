# Shared by the cluster benchmarks (scripts/bench_scaling.sh, scripts/bench_http_vs_grpc.sh):
# sourced from the repository root with the model folder as $1. Sets `model`, `estuary` (env
# ESTUARY, default build/cli/estuary: another build's binary, to compare builds) and a scratch
# folder `work`; stops the `estuary up` whose pid is in `up_pid` and removes `work` on
# exit; reads a process's CPU ticks and a number out of a one-line JSON file.
model="${1:-models/stories12L}"
[ -d "$model" ] || { echo "no model folder $model" >&2; exit 1; }
estuary="${ESTUARY:-build/cli/estuary}"
[ -x "$estuary" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
work="$(mktemp -d)"
up_pid=""
bench_cleanup() {
  if [ -n "$up_pid" ]; then
    kill -TERM "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap bench_cleanup EXIT

ticks_per_second="$(getconf CLK_TCK)"
# utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat; the command
# name in field 2 has no spaces here).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
json_field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }
