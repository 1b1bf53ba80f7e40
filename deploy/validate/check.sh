#!/usr/bin/env bash
# Renders every overlay with `kubectl kustomize` and validates every object against the
# Kubernetes schemas and KEDA's CRD models (validate.mjs). Installs the npm packages of
# package-lock.json into deploy/validate/node_modules when they are missing. Exits 77 (ctest:
# skipped) with the reason when kubectl, node or the npm packages cannot be had here.
set -euo pipefail
cd "$(dirname "$0")/../.."
skip() { echo "SKIPPED: $*"; exit 77; }
command -v kubectl > /dev/null || skip "no kubectl (install kubectl 1.27+; it carries kustomize)"
command -v node > /dev/null || skip "no node (Debian: apt-get install nodejs npm)"
scripts/npm_install_once.sh deploy/validate \
  || skip "npm could not install kubernetes-models (no registry reachable?)"
for overlay in deploy/overlays/*/; do
  name="$(basename "$overlay")"
  rendered="$(kubectl kustomize "$overlay")"
  echo "== $name: $(grep -c '^kind:' <<< "$rendered") objects"
  node deploy/validate/validate.mjs <<< "$rendered" | tail -n 1
done
