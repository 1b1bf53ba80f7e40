#!/usr/bin/env bash
# Installs a folder's npm packages (npm ci from its package-lock.json) once, for every caller.
# Tests run in parallel (ctest -j): two of them needing the same node_modules must not both run
# npm ci, and neither may use a half-written tree. So the install runs under an exclusive lock
# and is finished only once its marker exists; the marker is what callers look for.
# usage: scripts/npm_install_once.sh DIR    (exit 0: installed; non-zero: npm failed)
set -euo pipefail
dir="$1"
marker="$dir/node_modules/.estuary-installed"
[ -f "$marker" ] && exit 0
exec 9> "$dir/.npm-install.lock"
flock -w 400 9
[ -f "$marker" ] && exit 0
(cd "$dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error)
touch "$marker"
