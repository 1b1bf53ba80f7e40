#!/bin/sh
# Prints the Debian packages that own the shared libraries the given binaries load (ldd), one
# per line: the runtime image installs exactly these (deploy/Dockerfile), so a new dependency
# can never be left out of it. Fails, naming it, on a library ldd cannot find or dpkg does not
# know.
#
#   deploy/runtime_packages.sh BINARY...
set -eu
owner() {  # the package that owns $1, tried as given, resolved, and across the /usr merge
  for path in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    found="$(dpkg -S "$path" 2>/dev/null | head -n 1)" && [ -n "$found" ] && {
      echo "${found%%:*}"; return 0; }
  done
  echo "runtime_packages: no package owns $1" >&2
  return 1
}
libraries="$(ldd "$@" | awk '/not found/ { print "MISSING " $1 } /=> \// { print $3 }' | sort -u)"
if echo "$libraries" | grep -q '^MISSING'; then
  echo "runtime_packages: ldd cannot find: $(echo "$libraries" | grep '^MISSING' | cut -c9- | tr '\n' ' ')" >&2
  exit 1
fi
for lib in $libraries; do owner "$lib"; done | tr ',' '\n' | sed 's/ //g' | sort -u
