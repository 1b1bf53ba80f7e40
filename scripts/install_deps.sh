#!/usr/bin/env bash
# Installs the Debian 12 packages Estuary builds with, and any packages named as arguments, when
# any is missing. Idempotent and quiet.
#
#   scripts/install_deps.sh [EXTRA_PACKAGE...]
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libabsl-dev libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libucx-dev ucx-utils
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libhwy-dev libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev
  libboost-dev
  clang libclang-rt-dev
  "$@"
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
