#!/usr/bin/env bash
# Starts moto's S3 server on loopback as a fast, disposable S3 for tests, creates the test bucket
# and writes an env file that tests `source`. moto is a mock: it is atomic for conditional puts
# (one winner under races) but it is not a durability test; use scripts/ceph-up.sh for RGW.
#
#   STRATA_MOTO_DIR   state dir (pid, log, env)          default /tmp/strata-moto
#   STRATA_MOTO_PORT  listening port on 127.0.0.1        default 9310
#   STRATA_S3_BUCKET  bucket to create                   default strata
#
# Prints the env file path on success; exits non-zero with the server log's tail on failure.
set -euo pipefail

DIR=${STRATA_MOTO_DIR:-/tmp/strata-moto}
PORT=${STRATA_MOTO_PORT:-9310}
BUCKET=${STRATA_S3_BUCKET:-strata}
ACCESS_KEY=strata-test-access
SECRET_KEY=strata-test-secret
REGION=us-east-1

die() {
    echo "moto-up: $*" >&2
    if [[ -f "$DIR/moto.log" ]]; then
        echo "---- tail of $DIR/moto.log ----" >&2
        tail -n 40 "$DIR/moto.log" >&2 || true
    fi
    exit 1
}

port_in_use() { ss -Hltn "sport = :$1" | grep -q .; }

mkdir -p "$DIR"

# Idempotent-ish: a live server we started earlier is reused as it is.
if [[ -f "$DIR/moto.pid" ]] && kill -0 "$(cat "$DIR/moto.pid")" 2>/dev/null && [[ -f "$DIR/env" ]]; then
    echo "moto-up: already running (pid $(cat "$DIR/moto.pid"))" >&2
    echo "$DIR/env"
    exit 0
fi

if ! command -v moto_server >/dev/null 2>&1; then
    echo "moto-up: installing moto[server] from PyPI" >&2
    python3 -m pip install --quiet 'moto[server]' || die "pip install 'moto[server]' failed"
fi
command -v moto_server >/dev/null 2>&1 || die "moto_server not on PATH after install"

port_in_use "$PORT" && die "port $PORT is already in use (set STRATA_MOTO_PORT)"

setsid moto_server -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 < /dev/null &
echo $! >"$DIR/moto.pid"

ENDPOINT="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    kill -0 "$(cat "$DIR/moto.pid")" 2>/dev/null || die "moto_server exited during start-up"
    if curl -fsS -o /dev/null "$ENDPOINT/moto-api/" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
curl -fsS -o /dev/null "$ENDPOINT/moto-api/" || die "moto_server did not answer on $ENDPOINT within 10 s"

# moto does not check signatures, so a plain PUT creates the bucket. 200 or "already owned" both do.
code=$(curl -sS -o "$DIR/create-bucket.out" -w '%{http_code}' -X PUT "$ENDPOINT/$BUCKET")
if [[ "$code" != 200 ]] && ! grep -q BucketAlreadyOwnedByYou "$DIR/create-bucket.out"; then
    die "creating bucket $BUCKET failed with HTTP $code: $(cat "$DIR/create-bucket.out")"
fi

cat >"$DIR/env" <<ENV
# Written by scripts/moto-up.sh: source it before running the S3 tests against moto.
export STRATA_TEST_S3_URL='s3://$BUCKET/test?endpoint=$ENDPOINT&region=$REGION&allow_http=true'
export AWS_ACCESS_KEY_ID='$ACCESS_KEY'
export AWS_SECRET_ACCESS_KEY='$SECRET_KEY'
export AWS_REGION='$REGION'
export AWS_DEFAULT_REGION='$REGION'
export AWS_ENDPOINT='$ENDPOINT'
export AWS_ALLOW_HTTP=true
ENV
echo "moto-up: S3 on $ENDPOINT, bucket $BUCKET (pid $(cat "$DIR/moto.pid"))" >&2
echo "$DIR/env"
