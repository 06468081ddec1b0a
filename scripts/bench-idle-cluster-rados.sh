#!/usr/bin/env bash
# Storage load of an idle cluster on RADOS: starts three brokers on a fresh namespace of the
# test Ceph cluster (scripts/ceph-up.sh), creates one topic, lets ownership settle, then counts
# for WINDOW seconds the pool's OSD operations (`rados df`) and broker 1's own storage requests
# (its /metrics). Removes the namespace afterwards. A benchmark, not a test: run on demand.
#
#   scripts/bench-idle-cluster-rados.sh [PARTITIONS] [WINDOW_SECONDS]
#
#   STRATA_BIN        the broker, built with RADOS support   default target/release/strata
#   STRATA_CEPH_DIR   where scripts/ceph-up.sh put the cluster  default /tmp/strata-ceph
#
# Needs python3 with confluent-kafka (topic creation) and curl.
set -euo pipefail

PARTITIONS=${1:-300}
WINDOW=${2:-30}
BIN=${STRATA_BIN:-target/release/strata}
CEPH_DIR=${STRATA_CEPH_DIR:-/tmp/strata-ceph}
CONF="$CEPH_DIR/ceph.conf"
POOL=strata
NS="idlebench$(date +%s)"
URL="rados://$POOL/$NS?conf=$CONF&user=admin"
WORK=$(mktemp -d)
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rados -c "$CONF" -p "$POOL" -N "$NS" ls | xargs -r -n 1000 rados -c "$CONF" -p "$POOL" -N "$NS" rm
    rm -rf "$WORK"
}
trap cleanup EXIT

pool_ops() {
    rados -c "$CONF" df --format json | python3 -c "
import json, sys
pool = [p for p in json.load(sys.stdin)['pools'] if p['name'] == '$POOL'][0]
print(pool['read_ops'], pool['write_ops'])"
}

broker_requests() {
    curl -sf "http://$1/metrics" | grep '^strata_storage_requests_total' || true
}

for i in 1 2 3; do
    "$BIN" serve --listen "127.0.0.$i:0" --node-id "$i" --storage "$URL" \
        --metrics-listen 127.0.0.1:0 >"$WORK/broker-$i.log" 2>&1 &
    pids+=($!)
done
# Wait for each broker's "listening on" line (the harness contract in tests/src/process.rs).
for i in 1 2 3; do
    for _ in $(seq 100); do
        grep -q "listening on" "$WORK/broker-$i.log" && break
        sleep 0.1
    done
done
kafka=$(grep -o "listening on [0-9.:]*" "$WORK/broker-1.log" | awk '{print $3}')
metrics=$(grep -o "metrics on [0-9.:]*" "$WORK/broker-1.log" | awk '{print $3}')

python3 - "$kafka" "$PARTITIONS" <<'PY'
import sys
from confluent_kafka.admin import AdminClient, NewTopic
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
for future in admin.create_topics([NewTopic("idle", int(sys.argv[2]), 1)]).values():
    future.result()
PY
echo "created topic idle with $PARTITIONS partitions; settling 20 s" >&2
sleep 20

read -r reads_before writes_before < <(pool_ops)
broker_requests "$metrics" >"$WORK/before"
sleep "$WINDOW"
read -r reads_after writes_after < <(pool_ops)
broker_requests "$metrics" >"$WORK/after"

echo "idle cluster, 3 brokers, $PARTITIONS partitions, ${WINDOW} s:"
echo "  OSD read ops/s:  $(( (reads_after - reads_before) / WINDOW ))"
echo "  OSD write ops/s: $(( (writes_after - writes_before) / WINDOW ))"
echo "  broker 1 storage requests/s:"
paste "$WORK/before" "$WORK/after" | awk -v w="$WINDOW" '{
    op = $1; sub(/.*op="/, "", op); sub(/".*/, "", op);
    printf "    %-11s %8.1f\n", op, ($4 - $2) / w }'
