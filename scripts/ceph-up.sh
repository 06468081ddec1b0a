#!/usr/bin/env bash
# Starts a throw-away single-node Ceph 16.2 cluster for tests and CI: one mon, one mgr, one
# memstore OSD (data in the OSD's RAM) and radosgw, all under one directory, no systemd. Waits
# for HEALTH_OK *and* every PG active+clean, creates the RADOS pool `strata`, an RGW user with
# fixed test keys and the S3 bucket `strata`, and writes an env file for tests to `source`.
#
#   STRATA_CEPH_DIR        everything lives here (conf, keyring, data, logs, pids, env)
#                          default /tmp/strata-ceph
#   STRATA_CEPH_MON_PORT   mon msgr2 port; msgr1 uses the next one       default 13300
#   STRATA_RGW_PORT        radosgw HTTP port on 127.0.0.1                default 9320
#   STRATA_CEPH_POOL       RADOS pool to create                          default strata
#   STRATA_S3_BUCKET       RGW bucket to create                          default strata
#   STRATA_CEPH_INSTALL=1  apt-get install the Ceph packages if missing (CI sets it)
#
# Prints the env file path on its last line. On failure it prints the tail of every daemon log
# and leaves the directory for inspection (scripts/ceph-down.sh cleans up).
#
# Facts this relies on (measured here, see shared STORAGE-NOTES): a mon whose port is taken
# retries for 15 s and dies, so ports are checked first; an admin_socket in [global] makes every
# CLI client collide, so it is per daemon; HEALTH_OK can come before the PGs are active+clean.
set -euo pipefail

DIR=${STRATA_CEPH_DIR:-/tmp/strata-ceph}
MON_PORT=${STRATA_CEPH_MON_PORT:-13300}
RGW_PORT=${STRATA_RGW_PORT:-9320}
POOL=${STRATA_CEPH_POOL:-strata}
BUCKET=${STRATA_S3_BUCKET:-strata}
ACCESS_KEY=strata-test-access
SECRET_KEY=strata-test-secret
REGION=us-east-1
CONF="$DIR/ceph.conf"
START_TIMEOUT=${STRATA_CEPH_START_TIMEOUT:-90}
T0=$(date +%s%N)

log() {
    local ms=$((($(date +%s%N) - T0) / 1000000))
    printf 'ceph-up [%3d.%01ds]: %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}

dump_logs() {
    for f in "$DIR"/log/*.log "$DIR"/log/*.out; do
        [[ -s "$f" ]] || continue
        echo "---- tail of $f ----" >&2
        tail -n 25 "$f" >&2 || true
    done
}

die() {
    echo "ceph-up: FAILED: $*" >&2
    dump_logs
    if [[ -d "$DIR" ]]; then
        echo "ceph-up: state left in $DIR; run scripts/ceph-down.sh to clean up" >&2
    fi
    exit 1
}

port_in_use() { ss -Hltn "sport = :$1" | grep -q .; }

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

all_daemons_alive() {
    for d in mon mgr osd rgw; do pid_alive "$DIR/pids/$d.pid" || return 1; done
}

ceph_cli() { timeout 20 ceph -c "$CONF" --connect-timeout 10 "$@"; }

# ---- packages ---------------------------------------------------------------------------------
if ! command -v ceph-mon >/dev/null || ! command -v radosgw >/dev/null \
    || ! command -v uuidgen >/dev/null || ! [[ -e /usr/include/rados/librados.h ]]; then
    if [[ "${STRATA_CEPH_INSTALL:-0}" == 1 ]]; then
        log "installing Ceph packages (about 40 s)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends ceph-mon ceph-osd ceph-mgr radosgw \
            ceph-common librados-dev uuid-runtime >&2 \
            || die "apt-get install of the Ceph packages failed"
    else
        die "Ceph is not installed; run with STRATA_CEPH_INSTALL=1 or: apt-get install -y \
--no-install-recommends ceph-mon ceph-osd ceph-mgr radosgw ceph-common librados-dev uuid-runtime"
    fi
fi

# ---- reuse or clean ----------------------------------------------------------------------------
if all_daemons_alive && [[ -f "$DIR/env" ]]; then
    log "already running in $DIR"
    echo "$DIR/env"
    exit 0
fi
if [[ -d "$DIR" ]]; then
    log "stale state in $DIR: stopping what is left and starting fresh"
    STRATA_CEPH_DIR="$DIR" "$(dirname "$0")/ceph-down.sh" >&2
fi

for port in "$MON_PORT" "$((MON_PORT + 1))" "$RGW_PORT"; do
    port_in_use "$port" && die "port $port is already in use (set STRATA_CEPH_MON_PORT / STRATA_RGW_PORT)"
done

mkdir -p "$DIR"/{mon.a,mgr.x,osd.0,rgw.x,run,log,crash,pids}
FSID=$(uuidgen)
OSD_UUID=$(uuidgen)

cat >"$CONF" <<EOF
# Written by scripts/ceph-up.sh: a single-node test cluster. Every path points into $DIR.
[global]
fsid = $FSID
mon_host = [v2:127.0.0.1:$MON_PORT,v1:127.0.0.1:$((MON_PORT + 1))]
mon_initial_members = a
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv4 = true
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $DIR/keyring
run_dir = $DIR/run
log_file = $DIR/log/\$name.log
crash_dir = $DIR/crash
# One OSD: one replica, no host-level failure domain, no warnings about either.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
osd_crush_chooseleaf_type = 0
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_data_avail_warn = 2
mon_data_avail_crit = 1
# Start in seconds instead of tens of seconds.
paxos_propose_interval = 0.1
mgr_stats_period = 1
osd_mon_report_interval = 1
mon_osd_report_timeout = 30

[mon]
mon_data = $DIR/mon.\$id
admin_socket = $DIR/run/\$name.asok

[mgr]
mgr_data = $DIR/mgr.\$id
admin_socket = $DIR/run/\$name.asok

[osd]
osd_data = $DIR/osd.\$id
osd_objectstore = memstore
# memstore allocates as objects arrive; this is only the capacity it reports.
memstore_device_bytes = 8589934592
admin_socket = $DIR/run/\$name.asok

[client.rgw.x]
rgw_data = $DIR/rgw.\$id
admin_socket = $DIR/run/\$name.asok
# Without tcp_nodelay every small GET waits ~45 ms for Nagle/delayed ACK instead of ~2.5 ms.
rgw_frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw_enable_usage_log = false
rgw_enable_ops_log = false
EOF

# ---- keys --------------------------------------------------------------------------------------
KR="$DIR/keyring"
ceph-authtool --create-keyring "$KR" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$KR" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$KR" --gen-key -n mgr.x --cap mon 'allow profile mgr' --cap osd 'allow *' \
    --cap mds 'allow *' >/dev/null
ceph-authtool "$KR" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap mgr 'allow profile osd' \
    --cap osd 'allow *' >/dev/null
ceph-authtool "$KR" --gen-key -n client.rgw.x --cap mon 'allow rw' --cap osd 'allow rwx' \
    --cap mgr 'allow rw' >/dev/null

# ---- mon ---------------------------------------------------------------------------------------
monmaptool --create --fsid "$FSID" \
    --addv a "[v2:127.0.0.1:$MON_PORT,v1:127.0.0.1:$((MON_PORT + 1))]" "$DIR/monmap" >/dev/null
ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$KR" \
    >"$DIR/log/mkfs-mon.out" 2>&1 || die "ceph-mon --mkfs failed"

start_daemon() { # name, command...
    local name=$1
    shift
    setsid "$@" -f >"$DIR/log/$name.out" 2>&1 </dev/null &
    echo $! >"$DIR/pids/$name.pid"
}

start_daemon mon ceph-mon -c "$CONF" -i a
wait_for() { # description, seconds, command...
    local what=$1 limit=$2
    shift 2
    local deadline=$(($(date +%s) + limit))
    until "$@" >/dev/null 2>&1; do
        for d in "$DIR"/pids/*.pid; do
            pid_alive "$d" || die "$(basename "$d" .pid) exited while waiting for $what"
        done
        (($(date +%s) < deadline)) || die "timed out after ${limit}s waiting for $what"
        sleep 0.2
    done
}
wait_for "the mon to answer" 30 ceph_cli mon stat
log "mon up"

# ---- osd, mgr, pool ----------------------------------------------------------------------------
OSD_ID=$(ceph_cli osd new "$OSD_UUID") || die "ceph osd new failed"
[[ "$OSD_ID" == 0 ]] || die "expected osd id 0, got $OSD_ID"
ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$DIR/log/mkfs-osd.out" 2>&1 \
    || die "ceph-osd --mkfs failed"
start_daemon osd ceph-osd -c "$CONF" -i 0
start_daemon mgr ceph-mgr -c "$CONF" -i x

# Created right away, while the OSD boots: the PGs peer as soon as it is up.
ceph_cli osd pool create "$POOL" 8 8 >/dev/null 2>&1 || die "creating pool $POOL failed"
ceph_cli osd pool set "$POOL" size 1 --yes-i-really-mean-it >/dev/null 2>&1 \
    || die "setting pool $POOL size 1 failed"
ceph_cli osd pool application enable "$POOL" rados >/dev/null 2>&1 \
    || die "enabling application on pool $POOL failed"
osd_up() { ceph_cli osd stat | grep -q '1 up.*1 in'; }
wait_for "the OSD to be up" 60 osd_up
log "osd up, pool $POOL created"

# ---- radosgw -----------------------------------------------------------------------------------
start_daemon rgw radosgw -c "$CONF" -n client.rgw.x
ENDPOINT="http://127.0.0.1:$RGW_PORT"
wait_for "radosgw to answer on $ENDPOINT" 60 curl -fsS -o /dev/null "$ENDPOINT/"
log "radosgw up"

if ! radosgw-admin -c "$CONF" user info --uid=strata >/dev/null 2>&1; then
    radosgw-admin -c "$CONF" user create --uid=strata --display-name="Strata tests" \
        --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >"$DIR/log/rgw-user.out" 2>&1 \
        || die "radosgw-admin user create failed: $(cat "$DIR/log/rgw-user.out")"
fi
# curl signs SigV4 itself but (7.88) sends no x-amz-content-sha256, which RGW requires: give it
# the hash of the empty body.
EMPTY_SHA256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
code=$(curl -sS -o "$DIR/log/create-bucket.out" -w '%{http_code}' -X PUT \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H "x-amz-content-sha256: $EMPTY_SHA256" "$ENDPOINT/$BUCKET")
if [[ "$code" != 200 ]] && ! grep -q BucketAlreadyOwnedByYou "$DIR/log/create-bucket.out"; then
    die "creating bucket $BUCKET failed with HTTP $code: $(cat "$DIR/log/create-bucket.out")"
fi
log "user and bucket $BUCKET ready"

# ---- healthy? ----------------------------------------------------------------------------------
healthy() {
    local health pgs
    health=$(ceph_cli health 2>/dev/null) || return 1
    [[ "$health" == HEALTH_OK ]] || return 1
    pgs=$(ceph_cli pg stat 2>/dev/null) || return 1
    # "97 pgs: 97 active+clean; ..." — every PG, and only that state.
    [[ "$pgs" =~ ^([0-9]+)\ pgs:\ ([0-9]+)\ active\+clean\; ]] \
        && [[ "${BASH_REMATCH[1]}" == "${BASH_REMATCH[2]}" ]]
}
deadline=$(($(date +%s) + START_TIMEOUT))
until healthy; do
    all_daemons_alive || die "a daemon exited while waiting for HEALTH_OK"
    if (($(date +%s) >= deadline)); then
        echo "ceph-up: health: $(ceph_cli health detail 2>&1 || true)" >&2
        echo "ceph-up: pgs: $(ceph_cli pg stat 2>&1 || true)" >&2
        die "cluster not HEALTH_OK with all PGs active+clean after ${START_TIMEOUT}s"
    fi
    sleep 0.3
done

cat >"$DIR/env" <<ENV
# Written by scripts/ceph-up.sh: source it before running the RADOS and S3 tests against Ceph.
export CEPH_CONF='$CONF'
export STRATA_TEST_RADOS_URL='rados://$POOL?conf=$CONF&user=admin'
export STRATA_TEST_S3_URL='s3://$BUCKET/test?endpoint=$ENDPOINT&region=$REGION&allow_http=true'
export AWS_ACCESS_KEY_ID='$ACCESS_KEY'
export AWS_SECRET_ACCESS_KEY='$SECRET_KEY'
export AWS_REGION='$REGION'
export AWS_DEFAULT_REGION='$REGION'
export AWS_ENDPOINT='$ENDPOINT'
export AWS_ALLOW_HTTP=true
ENV
log "HEALTH_OK, all PGs active+clean; mon :$MON_PORT, radosgw $ENDPOINT, pool $POOL, bucket $BUCKET"
echo "$DIR/env"
