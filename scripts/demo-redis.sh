#!/usr/bin/env bash
# make demo-redis: regionsim's three-region demo with every region's enforcers on a real
# Redis Cluster (3 masters each, cluster-require-full-coverage no) in local containers.
# The clusters are removed when the demo ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
regions=(us-east eu-west ap-south)
cleanup() { for r in "${regions[@]}"; do bash scripts/region.sh down "$r" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
for r in "${regions[@]}"; do bash scripts/region.sh up "$r"; done
bin/regionsim demo -out bin/demo \
  -redis 'us-east=127.0.0.1:7001|127.0.0.1:7002|127.0.0.1:7003,eu-west=127.0.0.1:7101|127.0.0.1:7102|127.0.0.1:7103,ap-south=127.0.0.1:7201|127.0.0.1:7202|127.0.0.1:7203' "$@"
