#!/usr/bin/env bash
# Runs every benchmark of docs/BENCHMARKS.md against freshly spawned brokers and leaves one JSON
# report per run in OUT (default /tmp/strata-bench-results/<date>). Build first:
#   cargo build --release -p strata-bench -p strata
# Usage: bench/scripts/run-suite.sh [OUT] [DATA_PARENT]
#   DATA_PARENT: where the file:// broker keeps its data (default /tmp); say which disk it is.
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
run "disk-256k" disk --dir "$DATA_PARENT" --size 262144
run "disk-4k" disk --dir "$DATA_PARENT" --size 4096
run "disk-256k-parallel4" disk --dir "$DATA_PARENT" --size 262144 --parallel 4
rm -rf "$DATA_PARENT/strata-bench-data"
echo "reports in $OUT" >&2
