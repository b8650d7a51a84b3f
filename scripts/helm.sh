#!/usr/bin/env bash
# Builds helm from the Go module proxy into bin/tools (once per machine) and prints its path:
#
#   scripts/helm.sh           # bin/tools/helm, built when missing or of another version
#
# The version is pinned here (HELM_VERSION overrides it). The first build compiles helm and
# its Kubernetes dependencies: a few minutes on 2 cores; later calls find the binary and
# return at once. Nothing is downloaded but Go modules, through the proxy in this machine's
# Go configuration (nothing here names a host). A lock keeps two callers from building at
# once. Exit status non-zero with a message on stderr when the build fails; the caller
# (deploy/helm's test) fails on that under CI=true.
set -euo pipefail

version=${HELM_VERSION:-v4.3.2}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=$root/bin/tools
helm=$tools/helm

have() {
  [ -x "$helm" ] && [ "$("$helm" version --template '{{.Version}}' 2>/dev/null)" = "$version" ]
}

if have; then echo "$helm"; exit 0; fi

mkdir -p "$tools"
exec 9>"$tools/.helm.lock"
flock 9
if ! have; then
  echo "helm.sh: building helm $version into $tools (the first time takes a few minutes)" >&2
  start=$(date +%s)
  # Outside the project's module: go install pkg@version resolves helm's own go.mod.
  (cd "$tools" && CGO_ENABLED=0 GOBIN="$tools" GOFLAGS=-mod=mod \
    go install -trimpath -ldflags "-X helm.sh/helm/v4/internal/version.version=$version" \
    "helm.sh/helm/v4/cmd/helm@$version") >&2
  echo "helm.sh: built helm $version in $(( $(date +%s) - start )) s" >&2
  have || { echo "helm.sh: $helm does not report version $version" >&2; exit 1; }
fi
echo "$helm"
