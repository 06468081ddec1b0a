#!/usr/bin/env bash
# Stops the cluster scripts/ceph-up.sh started — exactly the daemons whose pids it recorded, never
# by name — and removes its directory (STRATA_CEPH_DIR, default /tmp/strata-ceph).
#
# In three steps, each daemon taking 1-2 s to stop on SIGTERM: radosgw first (with its OSD gone it
# waits 5 s), then the OSD and mgr together, the mon last (an OSD whose mon is gone waits 5 s).
set -uo pipefail

DIR=${STRATA_CEPH_DIR:-/tmp/strata-ceph}
stopped=0

stop() { # daemon names...
    local daemon f pid pids=() names=()
    for daemon in "$@"; do
        f="$DIR/pids/$daemon.pid"
        [[ -f "$f" ]] || continue
        pid=$(cat "$f")
        kill -0 "$pid" 2>/dev/null || continue
        kill "$pid" 2>/dev/null || continue
        pids+=("$pid")
        names+=("$daemon")
        stopped=$((stopped + 1))
    done
    for _ in $(seq 1 50); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    for i in "${!pids[@]}"; do
        if kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "ceph-down: ${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for 5 s; SIGKILL" >&2
            kill -9 "${pids[$i]}" 2>/dev/null
        fi
    done
}

stop rgw
stop osd mgr
stop mon
case "$DIR" in
    "" | / | /tmp | /root | /home) echo "ceph-down: refusing to remove $DIR" >&2; exit 1 ;;
esac
rm -rf "$DIR"
echo "ceph-down: stopped $stopped daemon(s), removed $DIR" >&2
