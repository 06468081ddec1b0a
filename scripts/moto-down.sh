#!/usr/bin/env bash
# Stops the moto server started by scripts/moto-up.sh (by its recorded pid only) and removes its dir.
set -uo pipefail

DIR=${STRATA_MOTO_DIR:-/tmp/strata-moto}

if [[ -f "$DIR/moto.pid" ]]; then
    pid=$(cat "$DIR/moto.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
    fi
fi
rm -rf "$DIR"
echo "moto-down: stopped" >&2
