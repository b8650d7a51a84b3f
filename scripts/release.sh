#!/usr/bin/env bash
# Versioned, reproducible release builds of allot's three binaries (issue 24 §1).
#
#   scripts/release.sh [archives]   into bin/release/<version>/ (ALLOT_RELEASE_DIR overrides):
#                                     allot-<version>-linux-<arch>.tar.gz for each arch of
#                                       ALLOT_RELEASE_ARCHES (default "amd64 arm64"): the
#                                       static enforcer, balancer and regionsim, README.md,
#                                       CHANGELOG.md and the shipped configs/ (no Go files);
#                                     NOTES.md: the version, commit and Go toolchain, and
#                                       CHANGELOG.md's section for the version;
#                                     SHA256SUMS over the archives and NOTES.md
#                                       (`sha256sum -c SHA256SUMS` checks them).
#   scripts/release.sh binaries DIR [ARCH]
#                                   the three stamped static binaries for linux/ARCH (default
#                                   the host's) into DIR: what the image is made of
#   scripts/release.sh ldflags      the -ldflags that stamp the version and commit (make build)
#   scripts/release.sh describe     the version, the commit and the source date, a line each
#   scripts/release.sh notes        NOTES.md's changes for the version (ALLOT_CHANGELOG reads
#                                   another file than CHANGELOG.md: the tests')
#
# The version is ALLOT_VERSION, else `git describe --tags --match 'v[0-9]*'` ("v0.3.0" on a
# tagged commit, "v0.3.0-5-gabc1234" five commits after it; "-dirty" appended when the
# tree has changes, untracked files included), else "dev" (no tag reaches the commit).
# The commit is ALLOT_COMMIT, else `git rev-parse HEAD` ("-dirty" likewise), else "unknown".
# The source date is SOURCE_DATE_EPOCH, else the commit's time, else 0.
#
# Reproducible: the same commit built with the same Go toolchain (NOTES.md names it), GNU
# tar and gzip gives the same bytes. The binaries are CGO_ENABLED=0 with -trimpath, no
# VCS stamp and an empty build ID, at GOAMD64=v1 / GOARM64=v8.0 whatever the environment
# says; the archives list their files sorted by name, owned by 0:0, with the source
# date as every mtime and normalised modes, gzipped without a name or a time.
# e2e/release_test.go builds one arch twice and compares the bytes.
#
# The changelog: a version with its own `## <version>` section in CHANGELOG.md gets it in
# NOTES.md; a build no tag names exactly (dev, v0.3.0-5-g…, -dirty) gets `## Unreleased`;
# a release version without its section is refused before anything is built.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pkg=github.com/allot-dev/allot/pkg/version
# Nothing from the caller's environment changes what the compiler and linker produce.
unset GOFLAGS GOEXPERIMENT
export GOAMD64=v1 GOARM64=v8.0 CGO_ENABLED=0

in_git() { git rev-parse --is-inside-work-tree >/dev/null 2>&1; }

dirty() { in_git && [ -n "$(git status --porcelain --untracked-files=normal 2>/dev/null)" ]; }

version() {
  if [ -n "${ALLOT_VERSION:-}" ]; then
    echo "$ALLOT_VERSION"
    return
  fi
  local v
  if in_git && v=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
    if dirty; then v="$v-dirty"; fi
    echo "$v"
  else
    echo dev
  fi
}

commit() {
  if [ -n "${ALLOT_COMMIT:-}" ]; then
    echo "$ALLOT_COMMIT"
  elif in_git; then
    local c
    c=$(git rev-parse HEAD)
    if dirty; then c="$c-dirty"; fi
    echo "$c"
  else
    echo unknown
  fi
}

epoch() {
  if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    echo "$SOURCE_DATE_EPOCH"
  elif in_git; then
    git log -1 --format=%ct
  else
    echo 0
  fi
}

VERSION=$(version)
COMMIT=$(commit)
EPOCH=$(epoch)
case "$VERSION" in
  *[!A-Za-z0-9._+-]* | "" | [.-]*)
    echo "release: version \"$VERSION\": want letters, digits and . _ + - (a git tag such as v0.3.0)" >&2
    exit 2 ;;
esac
case "$EPOCH" in
  *[!0-9]* | "") echo "release: SOURCE_DATE_EPOCH \"$EPOCH\": want whole seconds since 1970" >&2; exit 2 ;;
esac

changelog_file="${ALLOT_CHANGELOG:-CHANGELOG.md}"

ldflags() { echo "-s -w -buildid= -X $pkg.version=$VERSION -X $pkg.commit=$COMMIT"; }

# build DIR ARCH: the three binaries, static and stamped, into DIR.
build() {
  GOOS=linux GOARCH="$2" go build -trimpath -buildvcs=false -ldflags "$(ldflags)" \
    -o "$1/" ./cmd/enforcer ./cmd/balancer ./cmd/regionsim
}

# section NAME: the body of CHANGELOG.md's "## NAME" section, blank lines trimmed at both ends.
section() {
  awk -v want="$1" '
    /^## / { if (found) exit; if ($2 == want) { found = 1; next } }
    found { lines[++n] = $0 }
    END {
      first = 1; while (first <= n && lines[first] ~ /^[ \t]*$/) first++
      last = n; while (last >= first && lines[last] ~ /^[ \t]*$/) last--
      for (i = first; i <= last; i++) print lines[i]
    }' "$changelog_file"
}

# changelog: NOTES.md's changelog part for VERSION, or an error when a release has none.
changelog() {
  [ -f "$changelog_file" ] || { echo "release: $changelog_file: no such file" >&2; return 2; }
  if awk -v want="$VERSION" '/^## / && $2 == want { found = 1 } END { exit !found }' "$changelog_file"; then
    local body
    body=$(section "$VERSION")
    if [ -z "$body" ]; then
      echo "release: $changelog_file's \"## $VERSION\" section is empty" >&2
      return 1
    fi
    printf '%s\n' "$body"
    return
  fi
  case "$VERSION" in
    dev | *-dirty | *-[0-9]*-g[0-9a-f]*) ;;
    *)
      echo "release: $changelog_file has no \"## $VERSION\" section: write what changed under that heading (the Unreleased notes, moved) before building the release" >&2
      return 1 ;;
  esac
  echo "Not a release: the changes since the last one (CHANGELOG.md, \"Unreleased\")."
  echo
  local body
  body=$(section Unreleased)
  printf '%s\n' "${body:-(none yet)}"
}

archives() {
  local out="${ALLOT_RELEASE_DIR:-bin/release/$VERSION}"
  local arches="${ALLOT_RELEASE_ARCHES:-amd64 arm64}"
  local notes
  notes=$(changelog)
  stage=$(mktemp -d "${TMPDIR:-/tmp}/allot-release.XXXXXX") # global: the EXIT trap reads it
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$out"
  rm -f "$out"/allot-*-linux-*.tar.gz "$out/NOTES.md" "$out/SHA256SUMS"
  local gover
  gover=$(go env GOVERSION)
  echo "release: $VERSION (commit $COMMIT, $gover, source date $EPOCH) for linux/{${arches// /,}} into $out" >&2
  for arch in $arches; do
    case "$arch" in
      amd64 | arm64) ;;
      *) echo "release: arch \"$arch\": want amd64 or arm64" >&2; exit 2 ;;
    esac
    local name="allot-$VERSION-linux-$arch"
    local dir="$stage/$name"
    mkdir -p "$dir"
    build "$dir" "$arch"
    cp README.md CHANGELOG.md "$dir/"
    find configs -type f ! -name '*.go' ! -path '*/testdata/*' | LC_ALL=C sort | while read -r f; do
      mkdir -p "$dir/$(dirname "$f")"
      cp "$f" "$dir/$f"
    done
    tar -C "$stage" --sort=name --format=ustar --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
      --mode='a+rX,u+w,go-w' -cf - "$name" | gzip -n -6 >"$out/$name.tar.gz"
    echo "release: $out/$name.tar.gz" >&2
  done
  {
    echo "# allot $VERSION"
    echo
    echo "- commit: $COMMIT"
    echo "- built with: $gover, CGO_ENABLED=0, -trimpath, for linux/{${arches// /,}}"
    echo "- source date: $(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ) (every file's time in the archives)"
    echo
    echo "Check the files with \`sha256sum -c SHA256SUMS\`. \`make release\` on the same commit"
    echo "with $gover gives the same bytes."
    echo
    echo "## Changes"
    echo
    printf '%s\n' "$notes"
  } >"$out/NOTES.md"
  (cd "$out" && LC_ALL=C sha256sum -- $(LC_ALL=C ls allot-*-linux-*.tar.gz) NOTES.md >SHA256SUMS)
  echo "release: $out/SHA256SUMS" >&2
  echo "$out"
}

case "${1:-archives}" in
  archives) archives ;;
  binaries)
    [ $# -ge 2 ] || { echo "usage: scripts/release.sh binaries DIR [ARCH]" >&2; exit 2; }
    build "$2" "${3:-$(go env GOARCH)}" ;;
  ldflags) ldflags ;;
  describe) printf '%s\n%s\n%s\n' "$VERSION" "$COMMIT" "$EPOCH" ;;
  notes) changelog ;;
  *) echo "usage: scripts/release.sh [archives | binaries DIR [ARCH] | ldflags | describe | notes]" >&2; exit 2 ;;
esac
