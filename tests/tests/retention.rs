//! Time-based retention deletes old data: with `retention.ms` set on a topic, records whose
//! timestamps are older than that disappear, the log start offset moves past them, fetching
//! them answers OFFSET_OUT_OF_RANGE, and offsets keep counting up for new records.
//!
//! The records are produced with CreateTime timestamps an hour in the past, so they are
//! expired the moment they land and the test never waits for time to pass. The broker is
//! started with a short retention check and segment interval so that it acts within seconds.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kafka_protocol::messages::FetchRequest;
use strata_tests::clients::{consume_exactly, create_topic, produce_all, producer, watermarks};
use strata_tests::raw::{RawConnection, FETCH_VERSION_CAP};
use strata_tests::records::{assert_partitions_match, now_ms, numbered_records};
use strata_tests::wait::{wait_until_async, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

/// Kafka's error code OFFSET_OUT_OF_RANGE.
const OFFSET_OUT_OF_RANGE: i16 = 1;

/// Broker settings (crates/server's `[log]` section) that make retention act quickly.
const FAST_RETENTION: &str = r#"
[log]
retention_check_interval = "200ms"
segment_interval = "200ms"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_records_older_than_retention_ms_and_advances_the_log_start() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_config(FAST_RETENTION));
    let bootstrap = broker.bootstrap();
    let topic = "retention-by-time";
    // A minute: the old records are far past it, new ones far inside it.
    create_topic(&bootstrap, topic, 1, &[("retention.ms", "60000")]).await;

    let hour_ago = now_ms() - 3_600_000;
    let old: Vec<_> = numbered_records(50, Some(hour_ago), 10)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let producer = producer(&bootstrap, &[]);
    let acked = produce_all(&producer, topic, &old).await;
    assert_eq!(acked.last().map(|a| a.offset), Some(49));

    let log_start = wait_until_async(
        &format!("retention moves the log start of {topic}/0 past the 50 expired records"),
        DEADLINE,
        || {
            let bootstrap = bootstrap.clone();
            async move {
                let (low, _) = watermarks(&bootstrap, topic, 0).await;
                (low >= 50).then_some(low)
            }
        },
    )
    .await;
    assert_eq!(
        log_start, 50,
        "the log start offset is the next offset, not beyond it"
    );
    assert_eq!(watermarks(&bootstrap, topic, 0).await, (50, 50));

    let mut raw = RawConnection::connect(broker.addr());
    let version = RawConnection::negotiate::<FetchRequest>(&raw.api_versions(), FETCH_VERSION_CAP);
    let fetched = raw.fetch(version, topic, 0, 0, 1 << 20);
    assert_eq!(
        fetched.error_code, OFFSET_OUT_OF_RANGE,
        "Fetch of a deleted offset"
    );

    // Offsets continue after the deleted ones; new records are served.
    let fresh: Vec<_> = numbered_records(10, Some(now_ms()), 1)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let acked = produce_all(&producer, topic, &fresh).await;
    assert_eq!(
        acked.first().map(|a| a.offset),
        Some(50),
        "offsets continue after retention"
    );
    let consumed = consume_exactly(&bootstrap, topic, &[(0, 50)], 10).await;
    let produced = BTreeMap::from([(0, fresh.into_iter().map(|(_, r)| r).collect::<Vec<_>>())]);
    assert_partitions_match(&produced, &consumed, 50);
}
