#!/usr/bin/env bash
# Catch-up reads of compacted data held on the write-ahead tier by `local.retention.ms`, against
# the same read from the bulk tier (docs/BENCHMARKS.md, "Tiered storage"). Write-ahead tier on
# the RADOS pool, bulk tier on radosgw S3, both from scripts/ceph-up.sh. Build first:
#   cargo build --release -p strata-bench -p strata --features strata/rados
#   bench/scripts/held-catch-up.sh [RECORDS] [ROUNDS]     default 500000 records of 1 KB, 2 rounds
# Each run is a fresh broker on fresh locations: produce, wait past the segment interval so
# every record is compacted, then one consumer reads everything from offset 0. The tail cache
# is cut to 32 MiB so nearly every byte comes from storage.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/target/release}"
ENV_FILE="${STRATA_CEPH_DIR:-/tmp/strata-ceph}/env"
# shellcheck disable=SC1090
source "$ENV_FILE"
RECORDS="${1:-500000}"
ROUNDS="${2:-2}"
CONF="${CEPH_CONF:-/tmp/strata-ceph/ceph.conf}"
export STRATA_LOG_CACHE_BYTES=32MiB STRATA_LOG_SEGMENT_INTERVAL=10s

for round in $(seq "$ROUNDS"); do
    for mode in bulk held; do
        name="held-$mode-$round-$$"
        wal="rados://strata/$name?conf=$CONF&user=admin"
        bulk="s3://strata/$name?endpoint=${AWS_ENDPOINT}&region=us-east-1&allow_http=true"
        extra=()
        if [ "$mode" = held ]; then
            extra=(--topic-config local.retention.ms=-1)
        fi
        echo "== round $round: segments on the $mode tier"
        "$BIN/strata-bench" --spawn-broker --storage "$bulk" \
            --broker-arg=--wal-storage --broker-arg="$wal" \
            throughput --records "$RECORDS" --record-size 1000 --consume-after 25 "${extra[@]}"
    done
done
