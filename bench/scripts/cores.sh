#!/usr/bin/env bash
# The broker's CPU per record, with the broker and the client pinned to separate cores and then
# sharing all of them (docs/BENCHMARKS.md, "Cores and CPU per record"). Build first:
#   cargo build --release -p strata-bench -p strata
# Usage: bench/scripts/cores.sh [BROKER_CPUS CLIENT_CPUS]...   default: "0 1" and "0,1 0,1"
# Env: RECORDS (default 3000000), REPEAT (default 2), PORT (default 19092), DATA (default
# /tmp/strata-bench-cores). Each run gets a fresh data directory and its own broker.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/target/release}"
RECORDS="${RECORDS:-3000000}"
REPEAT="${REPEAT:-2}"
PORT="${PORT:-19092}"
DATA="${DATA:-/tmp/strata-bench-cores}"

placements=("$@")
if ((${#placements[@]} == 0)); then
    placements=("0 1" "0,1 0,1")
fi

run() {
    local broker_cpus=$1 client_cpus=$2
    rm -rf "$DATA"
    # Let ext4 forget the inodes the previous run freed (see run-suite.sh).
    sync
    sleep 3
    taskset -c "$broker_cpus" "$BIN/strata" serve --listen "127.0.0.1:$PORT" \
        --storage "file://$DATA" >"$DATA.log" 2>&1 &
    local broker=$!
    # Start-up (creating the internal topics) takes well under this; waiting keeps it out of
    # the measured phases. A broker not listening by then fails the run loudly.
    sleep 2
    echo "== broker on cpus $broker_cpus, client on cpus $client_cpus"
    taskset -c "$client_cpus" "$BIN/strata-bench" --bootstrap "127.0.0.1:$PORT" \
        --broker-pid "$broker" throughput --records "$RECORDS" |
        grep -E '^(phase|produce |consume )' || true
    kill "$broker"
    wait "$broker" 2>/dev/null || true
}

for ((i = 0; i < REPEAT; i++)); do
    for placement in "${placements[@]}"; do
        # shellcheck disable=SC2086
        run $placement
    done
done
