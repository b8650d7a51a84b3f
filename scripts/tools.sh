#!/usr/bin/env bash
# Finds, or installs from Debian, the external tools the tests run, and prints the path of
# the one asked for:
#
#   scripts/tools.sh promtool     # promtool, from Debian's prometheus package
#   scripts/tools.sh chromium     # chromium (headless), for the dashboard's browser test
#
# A tool already on PATH is used as it is. Otherwise it is installed with apt-get, from the
# package mirror in this machine's apt configuration (nothing here names a host), as root
# or through sudo. Exit status 1 with a message on stderr when the tool is neither present
# nor installable; the callers (the Go tests in configs/ and pkg/balancer/dashboard) fail
# on that under CI=true.
set -euo pipefail

apt_install() {
  local pkg=$1 sudo=()
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "tools: $pkg is not installed, and installing it needs root (no sudo here)" >&2
      return 1
    fi
    sudo=(sudo -n)
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "tools: $pkg is not installed and there is no apt-get to install it with" >&2
    return 1
  fi
  echo "tools: installing Debian's $pkg" >&2
  # The package's service is not started (no init in containers, and none is wanted):
  # policy-rc.d answers 101 "action forbidden" for the duration of the install.
  local policy=/usr/sbin/policy-rc.d created=
  if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  local rc=0
  { "${sudo[@]}" apt-get update -qq &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg"; } >&2 || rc=$?
  if [ -n "$created" ]; then rm -f "$policy"; fi
  return $rc
}

# need TOOL PACKAGE: the path of TOOL, installing PACKAGE when TOOL is missing.
need() {
  local tool=$1 pkg=$2
  if ! command -v "$tool" >/dev/null 2>&1; then
    apt_install "$pkg" || { echo "tools: could not install $pkg (for $tool)" >&2; exit 1; }
  fi
  command -v "$tool" || { echo "tools: $pkg installed but $tool is not on PATH" >&2; exit 1; }
}

case "${1:-}" in
  promtool) need promtool prometheus ;;
  chromium) need chromium chromium ;;
  *) echo "usage: $0 promtool|chromium" >&2; exit 2 ;;
esac
