#!/usr/bin/env bash
# Builds the container images allot's tests, demo and e2e stack use, locally, because no
# registry can be reached from these machines. Nothing is ever pulled.
#
#   scripts/images.sh [base]   allot/base:bookworm-1: a minimal Debian root made by
#                              debootstrap with redis-server, etcd-server and iproute2,
#                              then `docker import`ed. What pkg/testenv runs Redis and etcd from.
#   scripts/images.sh gateway  allot/gateway:bookworm-2: the base plus Debian's nginx and
#                              caddy (the gateways of the e2e stack and its tests), installed
#                              with apt from the same mirror.
#   scripts/images.sh stack    allot/stack:<hash>: the gateway image plus allot's own static
#                              binaries (CGO_ENABLED=0 builds of every ./cmd/... main) in
#                              /usr/local/bin. <hash> is a content hash of the binaries and
#                              the gateway image, so a rerun with unchanged code reuses the
#                              image; the tag is the last line printed.
#   scripts/images.sh allot    allot/allot:<version>: the image users run (issue 24 §2; `make
#                              image`). The release's static binaries for this machine's arch
#                              (scripts/release.sh binaries: stamped with the version and
#                              commit) in /usr/local/bin and the shipped configs in
#                              /etc/allot, on the base image; runs as allot (uid:gid
#                              10001:10001), OCI labels, a HEALTHCHECK running `enforcer
#                              probe`, CMD enforcer. ALLOT_IMAGE_TAG overrides the tag; the
#                              tag is the last line printed.
#
# The package mirror is read from this machine's apt configuration, never hard-coded
# (ALLOT_DEBIAN_MIRROR overrides it). The base and gateway images are cached by tag: a
# machine builds them once (ALLOT_BASE_IMAGE, ALLOT_GATEWAY_IMAGE override the tags).
set -euo pipefail

what="${1:-base}"
tag="${ALLOT_BASE_IMAGE:-allot/base:bookworm-1}"
gateway_tag="${ALLOT_GATEWAY_IMAGE:-allot/gateway:bookworm-2}"
suite="${ALLOT_DEBIAN_SUITE:-bookworm}"

build_base() {
  if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "images: $tag present"
    return 0
  fi

  # The first Debian archive URI from apt's configuration (deb822 .sources or legacy list).
  local mirror="${ALLOT_DEBIAN_MIRROR:-}"
  if [ -z "$mirror" ]; then
    mirror=$( { awk '/^URIs:/{for(i=2;i<=NF;i++)print $i}' /etc/apt/sources.list.d/*.sources 2>/dev/null
                grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}'; } \
              | grep -v -- '-security' | grep '/debian/\?$' | head -n1 || true)
  fi
  if [ -z "$mirror" ]; then
    echo "images: no Debian mirror found in /etc/apt; set ALLOT_DEBIAN_MIRROR" >&2
    exit 1
  fi

  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "images: installing debootstrap"
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    else
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
  fi

  local root
  root=$(mktemp -d /tmp/allot-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "images: debootstrap $suite into $root (this takes a few minutes, once)"
  debootstrap --variant=minbase --include=redis-server,etcd-server,iproute2,ca-certificates \
    "$suite" "$root" "$mirror" >/tmp/allot-debootstrap.log 2>&1 || {
    tail -n 30 /tmp/allot-debootstrap.log >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$tag" >/dev/null
  rm -rf "$root"
  trap - EXIT
  echo "images: built $tag"
}

# The gateway image: apt-get inside a container of the base (whose sources.list debootstrap
# wrote with the mirror above), committed. Host networking reaches the mirror as the host does.
build_gateway() {
  build_base
  if docker image inspect "$gateway_tag" >/dev/null 2>&1; then
    echo "images: $gateway_tag present"
    return 0
  fi
  local name="allot-images-gateway-$$"
  echo "images: installing Debian's nginx and caddy into $gateway_tag (a minute, once)"
  docker rm -f "$name" >/dev/null 2>&1 || true
  if ! docker run --name "$name" --network host "$tag" sh -c '
      apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx caddy >/dev/null &&
      nginx -V 2>&1 | grep -q http_auth_request_module &&
      caddy list-modules 2>/dev/null | grep -qx http.handlers.reverse_proxy &&
      rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb' >/tmp/allot-gateway-build.log 2>&1; then
    tail -n 30 /tmp/allot-gateway-build.log >&2
    docker rm -f "$name" >/dev/null 2>&1 || true
    exit 1
  fi
  docker commit -c 'CMD ["nginx", "-g", "daemon off;"]' "$name" "$gateway_tag" >/dev/null
  docker rm -f "$name" >/dev/null
  echo "images: built $gateway_tag"
}

# The stack image: allot's binaries, static (CGO_ENABLED=0, -trimpath: the same source gives
# the same bytes), copied into a container of the gateway image and committed.
build_stack() {
  build_gateway >&2
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  stack_out=$(mktemp -d /tmp/allot-stack-bin.XXXXXX)
  trap 'rm -rf "$stack_out"' EXIT
  local out=$stack_out
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$out/" ./cmd/...)
  local hash
  hash=$( { docker image inspect -f '{{.Id}}' "$gateway_tag"; (cd "$out" && sha256sum -- *); } | sha256sum | cut -c1-12)
  local stack_tag="allot/stack:$hash"
  if docker image inspect "$stack_tag" >/dev/null 2>&1; then
    echo "images: $stack_tag present ($(cd "$out" && ls | tr '\n' ' '))" >&2
    echo "$stack_tag"
    return 0
  fi
  local name="allot-images-stack-$$"
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker create --name "$name" "$gateway_tag" true >/dev/null
  docker cp "$out/." "$name:/usr/local/bin/"
  docker commit "$name" "$stack_tag" >/dev/null
  docker rm -f "$name" >/dev/null
  echo "images: built $stack_tag with $(cd "$out" && ls | tr '\n' ' ')" >&2
  echo "$stack_tag"
}

# The allot image. Its labels (OCI image-spec annotations): version and revision from
# scripts/release.sh describe, created at the commit's time, source the module path (no
# URL is invented here). A health check needs no curl: the enforcer probes itself (GET
# /readyz at the HTTP address its environment gives, loopback for ":8080").
build_allot() {
  build_base >&2
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  local version commit epoch
  { read -r version; read -r commit; read -r epoch; } < <(bash "$root/scripts/release.sh" describe)
  local allot_tag="${ALLOT_IMAGE_TAG:-allot/allot:${version//+/-}}"
  allot_out=$(mktemp -d /tmp/allot-image.XXXXXX)
  trap 'rm -rf "$allot_out"' EXIT
  mkdir -p "$allot_out/bin" "$allot_out/etc"
  bash "$root/scripts/release.sh" binaries "$allot_out/bin" >&2
  (cd "$root/configs" && find . -type f ! -name '*.go' ! -path '*/testdata/*') | while read -r f; do
    mkdir -p "$allot_out/etc/$(dirname "$f")"
    cp "$root/configs/$f" "$allot_out/etc/$f"
  done
  # docker cp gives what it copies root as owner and keeps the modes: readable by all,
  # writable by none but root, whatever this shell's umask.
  chmod -R a+rX,go-w "$allot_out"
  local name="allot-images-allot-$$"
  docker rm -f "$name" >/dev/null 2>&1 || true
  if ! docker run --name "$name" --network none --user 0 "$tag" sh -c '
      groupadd --system --gid 10001 allot &&
      useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/allot --create-home \
        --shell /usr/sbin/nologin allot &&
      mkdir -p /etc/allot' >"$allot_out/run.log" 2>&1; then
    cat "$allot_out/run.log" >&2
    docker rm -f "$name" >/dev/null 2>&1 || true
    exit 1
  fi
  docker cp "$allot_out/bin/." "$name:/usr/local/bin/"
  docker cp "$allot_out/etc/." "$name:/etc/allot/"
  local old
  old=$(docker image inspect -f '{{.Id}}' "$allot_tag" 2>/dev/null || true)
  local created
  created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
  docker commit \
    -c 'USER 10001:10001' \
    -c 'WORKDIR /var/lib/allot' \
    -c 'EXPOSE 8080 8081' \
    -c 'CMD ["enforcer"]' \
    -c 'HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 CMD ["enforcer", "probe"]' \
    -c "LABEL org.opencontainers.image.title=\"allot\" org.opencontainers.image.description=\"allot's enforcer, balancer and regionsim\" org.opencontainers.image.version=\"$version\" org.opencontainers.image.revision=\"$commit\" org.opencontainers.image.created=\"$created\" org.opencontainers.image.source=\"github.com/allot-dev/allot\"" \
    "$name" "$allot_tag" >/dev/null
  docker rm -f "$name" >/dev/null
  local new
  new=$(docker image inspect -f '{{.Id}}' "$allot_tag")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then
    docker rmi "$old" >/dev/null 2>&1 || true # the image this tag named before, unless in use
  fi
  echo "images: built $allot_tag ($version, commit $commit)" >&2
  echo "$allot_tag"
}

case "$what" in
  base) build_base ;;
  gateway) build_gateway ;;
  stack) build_stack ;;
  allot) build_allot ;;
  *) echo "usage: scripts/images.sh [base|gateway|stack|allot]" >&2; exit 2 ;;
esac
