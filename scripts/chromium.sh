#!/usr/bin/env bash
# Prints the path of a headless-capable chromium, installing Debian's chromium package
# when none is found (the dashboard's browser test, pkg/balancer/dashboard, calls it under
# CI=true; `make chromium` calls it too). The package comes from this machine's own apt
# sources: no mirror is named here. ALLOT_CHROMIUM overrides the binary.
set -euo pipefail

find_chromium() {
  if [ -n "${ALLOT_CHROMIUM:-}" ]; then
    command -v "$ALLOT_CHROMIUM" && return 0
    return 1
  fi
  for b in chromium chromium-browser google-chrome-stable google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then
      command -v "$b"
      return 0
    fi
  done
  return 1
}

if find_chromium; then
  exit 0
fi

echo "chromium.sh: installing Debian's chromium package" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >&2

if ! find_chromium; then
  echo "chromium.sh: chromium still not found after apt-get install" >&2
  exit 1
fi
