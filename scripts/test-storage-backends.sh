#!/usr/bin/env bash
# Runs the S3 and RADOS backend tests against real servers: moto (fast S3 mock), then a real
# single-node Ceph (RGW for S3, RADOS natively), and stops every server it started, pass or fail.
#
#   STRATA_CEPH_INSTALL=1   let scripts/ceph-up.sh apt-get install Ceph if missing (CI)
#   STRATA_SKIP_MOTO=1      skip the moto round
#
# Meant for CI and for checking a change to crates/storage-s3 or crates/storage-rados by hand.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

cleanup() {
    "$HERE/moto-down.sh" >/dev/null 2>&1 || true
    "$HERE/ceph-down.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT

if [[ "${STRATA_SKIP_MOTO:-0}" != 1 ]]; then
    env_file=$("$HERE/moto-up.sh" | tail -n 1)
    (
        # shellcheck disable=SC1090
        source "$env_file"
        echo "== S3 backend against moto ($STRATA_TEST_S3_URL)"
        cargo test -p strata-storage-s3
    )
    "$HERE/moto-down.sh"
fi

env_file=$("$HERE/ceph-up.sh" | tail -n 1)
(
    # shellcheck disable=SC1090
    source "$env_file"
    echo "== S3 backend against Ceph RGW ($STRATA_TEST_S3_URL)"
    cargo test -p strata-storage-s3
    echo "== RADOS backend against Ceph ($STRATA_TEST_RADOS_URL)"
    cargo test -p strata-storage-rados --features rados
)
