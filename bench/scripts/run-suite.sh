#!/usr/bin/env bash
# Runs every benchmark of docs/BENCHMARKS.md against freshly spawned brokers and leaves one JSON
# report per run in OUT (default /tmp/strata-bench-results/<date>). Build first:
#   cargo build --release -p strata-bench -p strata
# Usage: [BASELINE=DIR] bench/scripts/run-suite.sh [OUT] [DATA_PARENT]
#   DATA_PARENT: where the file:// broker keeps its data (default /tmp); say which disk it is.
#   BASELINE: an earlier run's OUT; the closing table then shows each figure's change against
#   it, and which moved beyond both runs' spread (`strata-bench summary OUT --against DIR`).
# Each run spawns its own broker (memory:// or a fresh file:// directory) and kills it after, so
# runs do not see each other's data. Runs are repeated (REPEAT, default 3) because on a shared
# 2-core machine a single run says little; compare the spread, not one number.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BENCH="${BENCH:-$ROOT/target/release/strata-bench}"
OUT="${1:-/tmp/strata-bench-results/$(date +%Y%m%d-%H%M%S)}"
DATA_PARENT="${2:-/tmp}"
REPEAT="${REPEAT:-3}"
E2E_SECONDS="${E2E_SECONDS:-30}"
mkdir -p "$OUT"

fresh_dir() {
    local dir="$DATA_PARENT/strata-bench-data"
    rm -rf "$dir"
    # The previous run's tens of thousands of files were just freed. ext4 skips inodes freed
    # in the last few seconds when it allocates one (reading each one's inode-table block), so
    # the next broker's first seconds would pay for our cleanup, not for its own work.
    sync
    sleep 5
    mkdir -p "$dir"
    echo "file://$dir"
}

run() {
    local name="$1"
    shift
    echo "== $name (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    "$BENCH" "$@" --json "$OUT/$name.json"
}

for i in $(seq "$REPEAT"); do
    run "throughput-memory-$i" --spawn-broker --storage memory:// throughput
    run "throughput-file-$i" --spawn-broker --storage "$(fresh_dir)" throughput
done
# More records than the broker's 256 MiB tail cache: consumption partly from storage.
run "throughput-memory-beyond-cache" --spawn-broker --storage memory:// throughput --records 6000000
run "throughput-file-beyond-cache" --spawn-broker --storage "$(fresh_dir)" throughput --records 6000000
for linger in 0 1 5; do
    run "e2e-memory-linger$linger" --spawn-broker --storage memory:// \
        e2e --linger-ms "$linger" --duration "$E2E_SECONDS"
    run "e2e-file-linger$linger" --spawn-broker --storage "$(fresh_dir)" \
        e2e --linger-ms "$linger" --duration "$E2E_SECONDS"
done
# A 300 ms stall of the broker while a linger.ms 0 producer pipelines one-record requests: the
# backlog it leaves must drain within a second or two (docs/BENCHMARKS.md, "A backlog that
# never drained"); p99 stays near the stall's length, where the collapse gave seconds.
run "e2e-memory-linger0-paused" --spawn-broker --storage memory:// \
    e2e --linger-ms 0 --duration "$E2E_SECONDS" --pause-broker-at 12 --pause-broker-ms 300
# The OpenMessaging Benchmark's standard Kafka workload: 1 topic, 100 partitions, 1 KB
# records, 4 producers and 4 consumers (one group), at a rate this machine holds and at a
# higher one (docs/BENCHMARKS.md, "A standard workload").
for rate in 20000 100000; do
    run "omb-file-$rate" --spawn-broker --storage "$(fresh_dir)" -X batch.size=1048576 \
        e2e --rate "$rate" --duration "$E2E_SECONDS" --linger-ms 1 --partitions 100 \
        --record-size 1024 --producers 4 --consumers 4
done
run "disk-256k" disk --dir "$DATA_PARENT" --size 262144
run "disk-4k" disk --dir "$DATA_PARENT" --size 4096
run "disk-256k-parallel4" disk --dir "$DATA_PARENT" --size 262144 --parallel 4
# How the local backend publishes now (a reused file overwritten in place), and the floor a
# write-ahead journal would have (docs/BENCHMARKS.md, "Reused files").
run "disk-4k-publish-reused" disk --dir "$DATA_PARENT" --size 4096 --mode publish-reused
run "disk-4k-overwrite" disk --dir "$DATA_PARENT" --size 4096 --mode overwrite
# What compaction's deletes of write-ahead objects cost the local backend (docs/BENCHMARKS.md,
# "Deletes in groups").
run "store-delete-1500" disk --dir "$DATA_PARENT" --writes 8000 --size 1500 --parallel 16 --mode store-delete
# What a start costs after 300 starts before it (docs/BENCHMARKS.md, "Starts after many
# starts"): prints its own table.
echo "== restarts (load: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
"$BENCH" restarts --starts 300 --dir "$DATA_PARENT" | tee "$OUT/restarts.txt"
rm -rf "$DATA_PARENT/strata-bench-data"
echo "reports in $OUT" >&2
# The headline figures in one table (medians over the repeats, with their range).
"$BENCH" summary "$OUT" ${BASELINE:+--against "$BASELINE"} | tee "$OUT/summary.txt"
