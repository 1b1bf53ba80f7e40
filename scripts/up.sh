#!/usr/bin/env bash
# Builds Estuary and runs the main job on the default model: one story from `estuary generate`.
# (The local disaggregated cluster replaces this once it exists.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec ./build/cli/estuary generate --prompt "${ESTUARY_PROMPT:-Once upon a time}" \
  --max-tokens "${ESTUARY_MAX_TOKENS:-200}" "$@"
