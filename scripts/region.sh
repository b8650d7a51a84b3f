#!/usr/bin/env bash
# One region's stack on this machine, from the local image (nothing is pulled):
#   scripts/region.sh etcd-up                 # the etcd the regions share (127.0.0.1:2379)
#   scripts/region.sh up us-east              # that region's 3-master Redis Cluster
#   scripts/region.sh down us-east            # remove it
#   scripts/region.sh etcd-down
#   scripts/region.sh down all                # every region's cluster and the etcd
# Ports follow configs/regions/*.yaml: us-east 7001-7003, eu-west 7101-7103,
# ap-south 7201-7203. Containers use host networking and bind 127.0.0.1 only.
# Environment (for tests that run these lines in a network namespace of their own):
#   ALLOT_REGION_NETWORK  the containers' Docker network (default host); container:<name>
#                         joins that container's namespace, whose 127.0.0.1 is then theirs
#   ALLOT_REGION_PREFIX   the containers' name prefix (default allot-): each run removes
#                         and replaces only the containers named with its own prefix
set -euo pipefail
cd "$(dirname "$0")/.."
image="${ALLOT_BASE_IMAGE:-allot/base:bookworm-1}"
network="${ALLOT_REGION_NETWORK:-host}"
prefix="${ALLOT_REGION_PREFIX:-allot-}"

ports() {
  case "$1" in
    us-east) echo 7001 7002 7003 ;;
    eu-west) echo 7101 7102 7103 ;;
    ap-south) echo 7201 7202 7203 ;;
    *) echo "region.sh: unknown region '$1' (us-east, eu-west, ap-south)" >&2; exit 2 ;;
  esac
}

wait_for() { # wait_for DESCRIPTION COMMAND...: bounded poll, 30 s
  local what=$1; shift
  for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "region.sh: $what did not become ready in 30 s" >&2; exit 1
}

case "${1:-}" in
  etcd-up)
    bash scripts/images.sh >/dev/null
    docker rm -f "${prefix}etcd" >/dev/null 2>&1 || true
    docker run -d --name "${prefix}etcd" --label allot-stack=1 --network "$network" "$image" \
      etcd --name allot --data-dir /tmp/etcd \
      --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
      --listen-peer-urls http://127.0.0.1:2380 >/dev/null
    wait_for etcd sh -c "curl -sf http://127.0.0.1:2379/health | grep -q true"
    echo "etcd on 127.0.0.1:2379"
    ;;
  etcd-down)
    docker rm -f "${prefix}etcd" >/dev/null 2>&1 || true
    ;;
  up)
    region=${2:?region}
    bash scripts/images.sh >/dev/null
    addrs=()
    for p in $(ports "$region"); do
      docker rm -f "${prefix}redis-$p" >/dev/null 2>&1 || true
      docker run -d --name "${prefix}redis-$p" --label allot-stack=1 --network "$network" "$image" \
        redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
        --cluster-config-file "/tmp/nodes-$p.conf" --cluster-node-timeout 2000 \
        --cluster-require-full-coverage no \
        --save '' --appendonly yes --appendfsync everysec >/dev/null
      wait_for "redis $p" docker exec "${prefix}redis-$p" redis-cli -p "$p" ping
      addrs+=("127.0.0.1:$p")
    done
    first=$(ports "$region" | cut -d' ' -f1)
    docker exec "${prefix}redis-$first" redis-cli --cluster create "${addrs[@]}" --cluster-yes >/dev/null
    wait_for "cluster $region" sh -c "docker exec ${prefix}redis-$first redis-cli -p $first cluster info | grep -q cluster_state:ok"
    echo "$region: Redis Cluster on ${addrs[*]}"
    ;;
  down)
    region=${2:?region}
    if [ "$region" = all ]; then
      for r in us-east eu-west ap-south; do "$0" down "$r"; done
      "$0" etcd-down
      exit 0
    fi
    for p in $(ports "$region"); do docker rm -f "${prefix}redis-$p" >/dev/null 2>&1 || true; done
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
