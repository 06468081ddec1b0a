//! Fencing between brokers that share one storage, beyond the cluster's own tests: what a
//! broker that has been replaced does, and that its replacement is never hurt by it.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use strata_tests::clients::{consume_exactly, create_topic, produce_all, producer};
use strata_tests::process::SharedStorage;
use strata_tests::records::{assert_partitions_match, varied_records, TestRecord};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

/// A standalone broker compacting every second, on `storage`.
fn standalone(storage: &SharedStorage) -> StrataOptions {
    StrataOptions::default()
        .with_storage_url(storage.url())
        .with_args(["--cluster", "false"])
        .with_config("standalone_seal_check = \"200ms\"\n[log]\nsegment_interval = \"1s\"\n")
}

/// Issue 10, case 7: two `--cluster false` brokers started on one storage. The second seals
/// the first's stream and serves every partition. The first used to stay up — named leader in
/// its own Metadata, serving stale reads and refusing produce — and the winner could later
/// fail its compactions and exit. Now the first exits non-zero on its own, idle as it is, and
/// the second keeps every record of both and compacts (a graceful stop compacts everything
/// and exits 0 only if that worked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_standalone_broker_on_one_storage_ends_the_first_and_loses_nothing() {
    let storage = SharedStorage::new();
    let topic = "two-standalones";
    let mut first = StrataProcess::start_with(standalone(&storage));
    create_topic(&first.bootstrap(), topic, 1, &[]).await;
    let batch_one: Vec<(Option<i32>, TestRecord)> = varied_records(200)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let acked = produce_all(&producer(&first.bootstrap(), &[]), topic, &batch_one).await;
    assert_eq!(acked.last().map(|a| a.offset), Some(199));

    let mut second = StrataProcess::start_with(standalone(&storage));
    let status = tokio::task::block_in_place(|| {
        wait_until("the replaced standalone broker exits", DEADLINE, || {
            first.try_exit_status()
        })
    });
    assert!(
        !status.success(),
        "a replaced broker exits with a failure status, got {status}"
    );
    assert!(
        !first
            .log_lines_containing("sealed our write-ahead stream")
            .is_empty(),
        "the replaced broker should say why it exits\n{}",
        first.log_tail()
    );

    let batch_two: Vec<(Option<i32>, TestRecord)> = varied_records(200)
        .into_iter()
        .map(|r| (Some(0), r))
        .collect();
    let acked = produce_all(&producer(&second.bootstrap(), &[]), topic, &batch_two).await;
    assert_eq!(acked.first().map(|a| a.offset), Some(200));
    let status = second.sigterm();
    assert!(
        status.success(),
        "the surviving broker's final compaction failed: {status}\n{}",
        second.log_tail()
    );

    second.restart();
    let produced = BTreeMap::from([(
        0,
        batch_one
            .into_iter()
            .chain(batch_two)
            .map(|(_, r)| r)
            .collect::<Vec<_>>(),
    )]);
    let consumed = consume_exactly(&second.bootstrap(), topic, &[(0, 0)], 400).await;
    assert_partitions_match(&produced, &consumed, 0);
}
