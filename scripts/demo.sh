#!/usr/bin/env bash
# make demo-region — one region (us-east) for real: the shared etcd, a 3-master Redis
# Cluster and two enforcers, then a burst of checks, a live rule change through etcd and a
# Redis master outage. Everything runs on 127.0.0.1 and is removed at the end. (`make demo`
# is the three-region demo: regionsim, the balancer and its dashboard, in one process.)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/allot-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash scripts/region.sh down us-east
  bash scripts/region.sh etcd-down
  echo "demo: stopped; enforcer logs are in $work"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# burst N KEY: N checks for KEY spread over both enforcers, 8 at a time (one curl); prints
# how many were allowed and refused, and where the answers came from.
burst() {
  local urls=()
  for _ in $(seq 1 $(($1 / 2))); do urls+=(http://localhost:8080/v1/check http://localhost:8090/v1/check); done
  curl -s --no-progress-meter -Z --parallel-max 8 -d "{\"api_key\":\"$2\"}" -w '\n' "${urls[@]}" | grep . \
    | sed -E 's/.*"allowed":(true|false).*"source":"([a-z-]+)".*/\1 \2/' | sort | uniq -c \
    | awk '{printf "   %5d  %s  (source: %s)\n", $1, ($2=="true"?"allowed":"refused"), $3}'
}

echo "allot demo-region: one region (us-east) for real. For three regions and the balancer"
echo "moving shares between them, run make demo."

say "building the images (once per machine) and the enforcer"
bash scripts/images.sh
go build -o bin/ ./cmd/enforcer ./cmd/balancer
# The region config reports to the balancer over mutual TLS (none runs here: reports are
# dropped), with the certificates it names under bin/certs.
bin/balancer certs -dir bin/certs >/dev/null

say "starting etcd and us-east's Redis Cluster"
bash scripts/region.sh etcd-up
bash scripts/region.sh up us-east

say "starting two us-east enforcers (HTTP :8080 and :8090)"
bin/enforcer -config configs/regions/us-east.yaml -id us-east-1 >"$work/us-east-1.log" 2>&1 & pids+=($!)
bin/enforcer -config configs/regions/us-east.yaml -id us-east-2 \
  -grpc-addr 127.0.0.1:8091 -http-addr 127.0.0.1:8090 >"$work/us-east-2.log" 2>&1 & pids+=($!)
for _ in $(seq 1 150); do
  curl -sf localhost:8080/readyz >/dev/null 2>&1 && curl -sf localhost:8090/readyz >/dev/null 2>&1 && break
  sleep 0.2
done
curl -sf localhost:8080/readyz >/dev/null || { echo "demo: enforcers not ready; see $work"; exit 1; }
echo "   live enforcers in us-east, as each one counts them: $(curl -s localhost:8080/metrics | awk '/^allot_registry_peers/{print $2}')"

say "120 checks for key k_demo under the default rule (20/s, bursts of 40 globally; us-east enforces its third, 6.7/s and bursts of 13, shared by both enforcers)"
burst 120 k_demo
echo "   a refused answer, as a gateway sees it:"
for _ in $(seq 1 50); do
  out=$(curl -si -X POST localhost:8080/v1/check -d '{"api_key":"k_demo"}')
  if grep -q '^HTTP/1.1 429' <<<"$out"; then
    grep -iE '^(HTTP|ratelimit|retry-after|x-ratelimit)|allowed' <<<"$out" | sed 's/^/     /'; break
  fi
done

say "raising k_demo to 200/s (bursts of 400 globally; 67/s and 133 in us-east) with an override written to etcd — no restart"
rule='{"match":{"api_key":"k_demo"},"limits":[{"name":"second","rate":200,"per":"1s","burst":400}],"expires_at":"2030-01-01T00:00:00Z","reason":"demo"}'
b64() { printf '%s' "$1" | base64 -w0; }
curl -sf -X POST localhost:2379/v3/kv/put \
  -d "{\"key\":\"$(b64 /allot/rules/demo-override)\",\"value\":\"$(b64 "$rule")\"}" >/dev/null
sleep 1
burst 120 k_demo

say "pausing the Redis master that owns k_demo's slot: checks keep being answered"
slot=$(docker exec allot-redis-7001 redis-cli -p 7001 cluster keyslot 'allot:{key:k_demo}:x')
port=$(docker exec allot-redis-7001 redis-cli -p 7001 cluster nodes | awk -v s="$slot" '
  $3 ~ /master/ { for (i = 9; i <= NF; i++) { n = split($i, r, "-"); hi = (n == 2 ? r[2] : r[1])
    if (s >= r[1] + 0 && s <= hi + 0) { split($2, a, "[:@]"); print a[2]; exit } } }')
docker pause "allot-redis-$port" >/dev/null
echo "   paused 127.0.0.1:$port"
burst 60 k_demo
docker unpause "allot-redis-$port" >/dev/null
echo "   unpaused; the breaker probes again after 2 s"
sleep 3
burst 20 k_demo

say "metrics an SRE would watch (curl localhost:8080/metrics)"
curl -s localhost:8080/metrics | grep -E '^allot_(enforcer_decisions_total|fallback_transitions_total|registry_peers|enforcer_rules_info)' | grep -v ' 0$' | sed 's/^/   /'
