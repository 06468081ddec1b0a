#!/usr/bin/env bash
# Tail latency while a consumer replays old data (docs/BENCHMARKS.md, "Readers behind the
# tail"). Build first: cargo build --release -p strata-bench -p strata
#   bench/scripts/catch-up.sh fill                 # write the 10 GB topic `old` once
#   bench/scripts/catch-up.sh run LABEL [ENV=VALUE...]
#       one 30 s run at 10k records/s; CATCHUP=1 adds the replaying consumer; ENV=VALUE pairs
#       go to the broker, e.g. STRATA_LOG_CATCHUP_IO_MAX_BYTES_PER_SECOND=50MiB
# Env: DATA (default /tmp/strata-catchup), PORT (19094), METRICS_PORT (19095).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/target/release}"
DATA="${DATA:-/tmp/strata-catchup}"
PORT="${PORT:-19094}"
METRICS_PORT="${METRICS_PORT:-19095}"

start() {
    env "$@" "$BIN/strata" serve --listen "127.0.0.1:$PORT" --storage "file://$DATA" \
        --metrics-listen "127.0.0.1:$METRICS_PORT" >"$DATA.log" 2>&1 &
    broker=$!
    # Start-up takes well under this; a broker not listening by then fails the run loudly.
    sleep 3
}

stop() {
    kill "$broker"
    wait "$broker" 2>/dev/null || true
}

case "${1:-}" in
fill)
    rm -rf "$DATA"
    sync
    sleep 5
    start
    "$BIN/strata-bench" --bootstrap "127.0.0.1:$PORT" throughput --topic old --partitions 8 \
        --records 10000000 --record-size 1000 --no-consume
    # Past the 10 s segment interval, so every record is in a segment.
    sleep 15
    stop
    ;;
run)
    label=$2
    shift 2
    sync
    sleep 3
    start "$@"
    echo "== $label"
    "$BIN/strata-bench" --bootstrap "127.0.0.1:$PORT" --broker-pid "$broker" e2e \
        --rate 10000 --duration 30 ${CATCHUP:+--catch-up-topic old} |
        grep -E '^(phase|produce \(|end-to-end |catch-up read )' || true
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" |
        grep -E '^strata_log_(catchup|read_ahead|reads_total)' || true
    stop
    ;;
*)
    sed -n '2,9p' "$0"
    exit 2
    ;;
esac
