#!/usr/bin/env bash
# Builds the container images allot's tests and demo use, locally, because no registry
# can be reached from these machines. The base image is a minimal Debian root made by
# debootstrap with redis-server, etcd-server and iproute2, then `docker import`ed.
# The package mirror is read from this machine's apt configuration, never hard-coded.
#
# Images are cached by tag: a machine builds them once. ALLOT_BASE_IMAGE overrides the tag.
set -euo pipefail

tag="${ALLOT_BASE_IMAGE:-allot/base:bookworm-1}"
suite="${ALLOT_DEBIAN_SUITE:-bookworm}"

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "images: $tag present"
  exit 0
fi

# The first Debian archive URI from apt's configuration (deb822 .sources or legacy list).
mirror="${ALLOT_DEBIAN_MIRROR:-}"
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
echo "images: built $tag"
