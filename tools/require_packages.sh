#!/usr/bin/env bash
# Makes sure Debian packages are installed: the fuzzing toolchain (clang, libclang-rt-14-dev) and, for the ARM64
# flow, the cross toolchain and emulator. As root it installs the missing ones (apt-get update once, then install);
# otherwise it prints the exact command and exits 1.
#   bash tools/require_packages.sh PACKAGE...
set -euo pipefail

find_missing() {
  missing=()
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed" || missing+=("${package}")
  done
}

find_missing "$@"
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" -ne 0 ]]; then
  echo "error: missing Debian packages: ${missing[*]}. Install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
# One apt at a time: tests running in parallel may ask for packages together (apt itself fails on a held lock).
exec {lock}>/tmp/custom_ops_require_packages.lock
flock "${lock}"
find_missing "$@"  # again: another caller may have installed them while this one waited
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "Installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/require_packages.log 2>&1; then
  apt-get update >>/tmp/require_packages.log 2>&1
  apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/require_packages.log 2>&1 || {
    tail -n 20 /tmp/require_packages.log >&2
    echo "error: apt-get could not install ${missing[*]} (log: /tmp/require_packages.log)" >&2
    exit 1
  }
fi
